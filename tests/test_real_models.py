"""Real weights: speculative greedy output equals specdec's plain decoding bit for bit on the
real model pair, in float32 and in bfloat16 (emulated on CPUs without native bf16: slower, the
same rounding questions). No tolerance: the target's forward is block-invariant
(specdec.runtime.hf), so a difference is a bug, printed with the target's gap where it happened.
"""

import pytest

from specdec import DraftModel, PromptLookup, TreeDraft, generate
from specdec.conform.ties import first_difference
from specdec.errors import SpecdecError
from specdec.models.load import DEFAULT_DRAFT, DEFAULT_TARGET, check_same_vocab, load_model
from specdec.prompts.chat import encode_prompt

pytestmark = pytest.mark.real

PROMPTS = {
    "code": "Write a Python function that merges two sorted lists into one sorted list.",
    "chat": "What are three good habits for staying focused while working from home?",
    "translation": "Translate to German: The weather is nice today, so we are going to the lake.",
}
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def qwen(request):
    target, tok = load_model(DEFAULT_TARGET, dtype=request.param)
    draft, draft_tok = load_model(DEFAULT_DRAFT, dtype=request.param)
    check_same_vocab(tok, draft_tok, target, draft)
    return target, tok, draft


def assert_identical(target, prompt, plain, spec, label):
    diff = first_difference(target, prompt, plain, spec)
    assert diff is None, f"{label} ({target.dtype}): {diff.describe()}"


@pytest.mark.parametrize("task", PROMPTS)
def test_qwen_pair_speculation_equals_plain(qwen, task):
    target, tok, draft = qwen
    prompt = encode_prompt(tok, PROMPTS[task])
    plain = generate(target, prompt, max_new_tokens=NEW_TOKENS).new_tokens
    assert len(plain) > 0
    drafters = {"draft k=3": DraftModel(draft, 3), "lookup k=3": PromptLookup(3)}
    if task == "code":
        drafters["tree k=2 width=2"] = TreeDraft(DraftModel(draft, 2), width=2)
    for name, drafter in drafters.items():
        out = generate(target, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS, check=True)
        assert_identical(target, prompt, plain, out.new_tokens, f"{task}/{name}")
        if name.startswith("draft"):
            assert out.stats.accepted > 0  # a real draft agrees with its target sometimes


def test_qwen_target_logits_are_the_same_alone_and_in_any_block(qwen):
    """The property behind the equality, on the real weights and a real context: each of six
    tokens decoded alone gets the logits it gets as row i of a block of 2..6 rows, bitwise. On an
    AVX-512 BF16 CPU a probe that compared too few outputs left 1-row layers unpadded, and every
    row here differed in bf16 (greedy outputs then parted at HumanEval/2 and /9)."""
    import torch

    from specdec.runtime.hf.causal_lm import CausalLM

    target, tok, _ = qwen
    lm = CausalLM(target)
    lm.prefill(torch.tensor(encode_prompt(tok, PROMPTS["code"])))
    base = lm.length
    tokens = torch.tensor([750, 10880, 2019, 279, 1140, 13])
    alone = torch.cat([lm.forward(t.view(1)) for t in tokens])
    for size in range(2, len(tokens) + 1):
        lm.cache.trim(base)
        rows = torch.cat([lm.forward(tokens[i : i + size]) for i in range(0, len(tokens), size)])
        assert torch.equal(rows, alone), f"{target.dtype}: blocks of {size} rows differ from the rows alone"


def test_qwen_pair_shares_vocab_and_smollm2_does_not(qwen):
    target, target_tok, _ = qwen
    small, small_tok = load_model("smollm2-135m-instruct")
    with pytest.raises(SpecdecError, match="--proposer lookup"):
        check_same_vocab(target_tok, small_tok, target, small)


def test_qwen_cheaper_draft_equals_plain(qwen):
    """The draft restricted to the 32768 ids most frequent in the bundled text, with int8
    layers: its guesses still only propose, the output is the target's."""
    from specdec.methods.build import Drafts
    from specdec.runtime.hf.model_facts import HEAD_IDS

    target, tok, _ = qwen
    # A fresh copy: the fixture's draft was repacked by its first generation, and int8 layers or a
    # restricted head are made from the loaded weights, before that.
    fresh, _ = load_model(DEFAULT_DRAFT, dtype=str(target.dtype).removeprefix("torch."))
    cheap = Drafts(fresh, tok).model(("int8", 32768))
    assert getattr(cheap, HEAD_IDS).numel() == 32768
    prompt = encode_prompt(tok, PROMPTS["code"])
    plain = generate(target, prompt, max_new_tokens=NEW_TOKENS).new_tokens
    out = generate(target, prompt, drafter=DraftModel(cheap, 2), max_new_tokens=NEW_TOKENS, check=True)
    assert_identical(target, prompt, plain, out.new_tokens, "code/cheaper draft")
    assert out.stats.accepted > out.stats.proposed / 2  # frequent ids cover most of the code


def test_smollm2_speculation_equals_plain():
    model, tok = load_model("smollm2-135m-instruct")
    prompt = encode_prompt(tok, "List the planets of the solar system in order, one per line.")
    plain = generate(model, prompt, max_new_tokens=48).new_tokens
    for name, drafter in {"self-draft": DraftModel(model, 4), "lookup": PromptLookup(4)}.items():
        out = generate(model, prompt, drafter=drafter, max_new_tokens=48, check=True)
        assert_identical(model, prompt, plain, out.new_tokens, f"smollm2/{name}")


def long_run(model, tok, drafters: dict, n: int) -> None:
    """n new tokens: cache lengths equal the committed length every round (check=True), output
    equals plain decoding bit for bit, and memory grows by no more than
    the KV caches' expected growth plus a margin for allocator slack."""
    import psutil

    from specdec.cost.kv import kv_cache_bytes_for_config

    prompt = encode_prompt(tok, "Tell a long story about a lighthouse keeper and a storm.")
    plain = generate(model, prompt, max_new_tokens=n, eos_token_id=[]).new_tokens
    process = psutil.Process()
    for name, (drafter, draft_config) in drafters.items():
        kv = sum(kv_cache_bytes_for_config(c, len(prompt) + n, model.dtype.itemsize)
                 for c in (model.config, draft_config) if c is not None)
        before = process.memory_info().rss
        out = generate(model, prompt, drafter=drafter, max_new_tokens=n, eos_token_id=[], check=True)
        grown = process.memory_info().rss - before
        assert len(out.new_tokens) == n and out.finish_reason == "length"
        assert_identical(model, prompt, plain, out.new_tokens, f"long/{name}")
        assert grown < kv + (256 << 20), f"{name}: RSS grew {grown >> 20} MiB, KV is {kv >> 20} MiB"


def test_long_run_smollm2_both_proposers():
    model, tok = load_model("smollm2-135m-instruct")
    long_run(model, tok, {"self-draft": (DraftModel(model, 4), model.config),
                          "lookup": (PromptLookup(4), None)}, n=512)


@pytest.mark.slow
def test_long_run_qwen_pair_4096_tokens(qwen):  # both dtypes
    """About an hour on 2 CPU cores: run with `pytest -m slow`."""
    target, tok, draft = qwen
    long_run(target, tok, {"draft": (DraftModel(draft, 2), draft.config),
                           "lookup": (PromptLookup(2), None)}, n=4096)
