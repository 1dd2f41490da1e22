"""specdec's native runtime (specdec.runtime, kernels/decoder.cpp): its logits against
transformers' forward on the same weights, every row's bits alone, in blocks and as tree rows,
greedy speculative output equal to plain decoding bit for bit, the cache after trims, and the
configs it refuses. Real weights (SmolLM2, the Qwen pair) in the tests marked `real`."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from conftest import perturbed
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec import DraftModel, PromptLookup, TreeDraft, generate
from specdec.errors import SpecdecError
from specdec.models.quantized import install
from specdec.runtime import NativeLM, from_transformers
from specdec.decoder_config import decoder_config
from specdec.runtime.native.weight_source import read_model

VOCAB = 96


def tiny(kind: str = "qwen2", seed: int = 0, layers: int = 2, **extra) -> torch.nn.Module:
    """A float32 model of the shapes the kernels take (head_dim 32); Qwen2 with random q/k/v
    biases, so that the bias path is exercised."""
    torch.manual_seed(seed)
    shapes = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
                  tie_word_embeddings=False) | extra
    model = (Qwen2ForCausalLM(Qwen2Config(**shapes)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**shapes)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    return model.eval()


def native_pair(capacity: int = 16) -> tuple[NativeLM, NativeLM]:
    """(target, draft) on the native runtime: the draft a perturbed copy of the target, so it
    agrees often but not always."""
    model = tiny("qwen2", layers=2)
    target = from_transformers(copy.deepcopy(model), "int4", capacity=capacity)
    draft = from_transformers(perturbed(copy.deepcopy(model), seed=2, scale=0.05), "int4", capacity=capacity)
    return target, draft


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def pair(request):
    """(transformers model, the same model on the native runtime, int4)."""
    model = tiny(request.param)
    return model, from_transformers(copy.deepcopy(model), "int4", capacity=128)


def sequence(n: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def cache_as_the_runtimes(model: torch.nn.Module):
    """transformers' attention over keys (after rotary) and values rounded once to binary16, as
    the native runtime's cache holds them (decoder.cpp), so a reference differs from the runtime
    only where the design says it may."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    modules = (modeling_llama, modeling_qwen2, modeling_qwen3)
    originals = [m.apply_rotary_pos_emb for m in modules]

    def rounding(rotate):
        def apply(q, k, *args, **kwargs):
            q, k = rotate(q, k, *args, **kwargs)
            return q, k.half().to(k.dtype)
        return apply

    hooks = [m.register_forward_hook(lambda _, __, out: out.half().to(out.dtype))
             for name, m in model.named_modules() if name.endswith("v_proj")]
    for module, rotate in zip(modules, originals):
        module.apply_rotary_pos_emb = rounding(rotate)
    try:
        yield model
    finally:
        for module, rotate in zip(modules, originals):
            module.apply_rotary_pos_emb = rotate
        for hook in hooks:
            hook.remove()


def alone(lm, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's logits decoded one at a time from an empty cache."""
    lm.reset()
    return torch.cat([lm.forward(tokens[i : i + 1]) for i in range(tokens.numel())])


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_logits_match_transformers_on_the_same_quantized_weights(mode):
    """transformers' forward with the same Q4/Q8 layers installed (quant.model.install, the
    same kernels): the linear layers then compute the same bits from the same inputs, so the
    two differ only by float order in norms, rotary, attention and SiLU (~1e-7 of the logits'
    range, measured), except where that moves an int8 activation across a rounding boundary by
    one step: at most one row of the 24 per model, within 2% of the range (measured 0.8%).
    The reference reads its keys and values rounded to binary16, as the runtime's cache holds them."""
    for kind in ("qwen2", "llama"):
        model = tiny(kind)
        lm = from_transformers(copy.deepcopy(model), mode, capacity=64)
        reference = copy.deepcopy(model)
        install(reference, read_model(reference, decoder_config(reference.config), mode).linears)
        tokens = sequence(24)
        with torch.no_grad(), cache_as_the_runtimes(reference):
            expected = reference(tokens[None]).logits[0].float()
        got = alone(lm, tokens)
        off = (got - expected).abs().amax(-1) / expected.abs().max()
        assert int((off > 1e-5).sum()) <= 1 and off.max() <= 0.02, off
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_logits_near_transformers_on_the_dequantized_weights(pair):
    """Against transformers' float32 forward on the dense weights the Q4/Q8 codes stand for:
    the runtime's activations are int8 per block of 32 (about 0.4% of a block's largest value
    per element), so the logits differ by that much amplified through the layers: 5% of their
    range bounds it here (measured about 1%)."""
    model, lm = pair
    assert gap_to_dequantized(model, lm, "int4") <= 0.05


def gap_to_dequantized(model, lm, mode: str) -> float:
    """The largest logit gap of `lm` (alone, 24 tokens) to transformers' forward of `model` with
    the weights the `mode` codes stand for, as a share of the logits' range."""
    dense = copy.deepcopy(model)
    for name, weight in read_model(dense, decoder_config(dense.config), mode).linears.items():
        dense.get_submodule(name).weight.data = weight.dequantize()
    tokens = sequence(24)
    with torch.no_grad(), cache_as_the_runtimes(dense):
        expected = dense(tokens[None]).logits[0]
    return float((alone(lm, tokens) - expected).abs().max() / expected.abs().max())


def test_every_row_is_the_same_alone_and_in_blocks_of_2_to_17(pair):
    _, lm = pair
    tokens = sequence(60)
    single = alone(lm, tokens)
    for size in range(2, 18):
        lm.reset()
        blocks = torch.cat([lm.forward(tokens[i : i + size]) for i in range(0, tokens.numel(), size)])
        assert torch.equal(blocks, single), size
    lm.reset()
    assert torch.equal(lm.prefill(tokens), single[-1:])  # a prefill's last row too


@pytest.mark.parametrize("heads, kv_heads, hidden", [(2, 1, 256), (12, 2, 1536), (14, 2, 896), (9, 3, 576)])
def test_the_real_head_shapes_match_transformers_and_keep_every_rows_bits(heads, kv_heads, hidden):
    """The attention shapes of the real models, whose weighted sums take a group's heads in
    passes of 16 / V (decoder.cpp weighted_values): 2 heads of 128 dims (V = 8, 128 outputs a
    pass); the 1.5B target's 6 heads a K/V head (head_dim 128) as 2 + 2 + 2; the 0.5B draft's 7
    (head_dim 64, V = 4) as 4 + 3; SmolLM2-135M's 3. Over 70 tokens (two blocks of kKeyBlock
    keys) the logits match transformers' on the same quantized weights as in
    test_logits_match_transformers_on_the_same_quantized_weights: at the first shape within 2% of
    the range, and within 1e-5 but for at most a fifth of the rows, where float order moved an
    int8 activation across a rounding boundary (measured 13 of 70, at most 0.74%). At the wider
    ones such a move in an early row reaches every later row through its keys and values: 22-58
    rows past 1e-5, within 5% (measured 1.2-3.0%), where a wrong key, head or output would be off
    by the logits' scale. And every row keeps its bits in blocks and in a prefill."""
    model = tiny(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads)
    lm = from_transformers(copy.deepcopy(model), "int4", capacity=128)
    reference = copy.deepcopy(model)
    install(reference, read_model(reference, decoder_config(reference.config), "int4").linears)
    tokens = sequence(70)
    with torch.no_grad(), cache_as_the_runtimes(reference):
        expected = reference(tokens[None]).logits[0].float()
    single = alone(lm, tokens)
    off = (single - expected).abs().amax(-1) / expected.abs().max()
    if hidden == 256:
        assert int((off > 1e-5).sum()) <= 70 // 5 and off.max() <= 0.02, off
    else:
        assert off.max() <= 0.05, off
    for size in (3, 16, 70):
        lm.reset()
        blocks = torch.cat([lm.forward(tokens[i : i + size]) for i in range(0, tokens.numel(), size)])
        assert torch.equal(blocks, single), size
    lm.reset()
    assert torch.equal(lm.prefill(tokens), single[-1:])


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_every_row_is_the_same_whatever_the_threads_and_the_head_grouping(kv_heads):
    """Attention's tasks (row tiles x K/V heads x shares of a group's query heads) depend on
    the thread count and the block: 1, 2 and 3 threads, groups of 4, 2 and 1 query heads, a
    decode row alone (its group split across threads), blocks and a 60-row prefill (tiled
    rows) give every row the same bits."""
    lm = from_transformers(tiny(num_key_value_heads=kv_heads), "int4", capacity=64)
    tokens = sequence(60)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = alone(lm, tokens)
        for n in (2, 3):
            torch.set_num_threads(n)
            assert torch.equal(alone(lm, tokens), single), n
            lm.reset()
            assert torch.equal(torch.cat([lm.forward(tokens[:37]), lm.forward(tokens[37:])]), single), n
    finally:
        torch.set_num_threads(threads)


def test_tree_rows_equal_the_chain_rows_of_their_paths(pair):
    """A tree whose nodes branch off the true continuation: every node on the true path gets
    the bits of the chain row at its position; after keeping that path, decoding continues
    with the chain's bits."""
    _, lm = pair
    tokens = sequence(30)
    single = alone(lm, tokens)
    start = 20
    # root = tokens[start]; true path nodes 0 (depth 1), 2 (depth 2), 4 (depth 3); others are branches
    nodes = [tokens[start + 1], (tokens[start + 1] + 1) % VOCAB, tokens[start + 2], (tokens[start + 2] + 5) % VOCAB,
             tokens[start + 3], (tokens[start + 1] + 7) % VOCAB]
    parents = torch.tensor([-1, -1, 0, 0, 2, 1])
    lm.reset()
    lm.prefill(tokens[:start])
    rows = lm.forward_tree(torch.stack([tokens[start], *nodes]), parents)
    for row, position in ((0, start), (1, start + 1), (3, start + 2), (5, start + 3)):
        assert torch.equal(rows[row], single[position]), row
    lm.keep_positions(start, [0, 1, 3, 5])
    assert lm.length == start + 4 and lm.layer_lengths() == [start + 4] * 2
    assert torch.equal(lm.forward(tokens[start + 4 :]), single[start + 4 :])


def test_cache_after_trims_and_prefix_reuse(pair):
    _, lm = pair
    tokens = sequence(40)
    single = alone(lm, tokens)
    assert lm.length == 40 and lm.calls == 40
    lm.trim(25)
    assert lm.length == 25 and set(lm.layer_lengths()) == {25}
    assert torch.equal(lm.forward(tokens[25:31]), single[25:31])
    with pytest.raises(ValueError):
        lm.trim(32)
    # reuse keeps the cached prefix of the new prompt and forwards only the rest: the same bits
    other = torch.cat([tokens[:12], sequence(8, seed=9)])
    fresh = lm.prefill(other)
    lm.prefill(tokens[:31])
    assert torch.equal(lm.prefill(other, reuse=True), fresh) and lm.length == 20
    assert lm.calls == 1


def test_stored_weights_map_back_to_the_same_logits(tmp_path):
    """The model cache's copy of a model's native weights (runtime.native.stored_weights, mapped at load) gives
    every logit bit for bit, in int4 and int3 forms, with the full head and a restricted one."""
    from specdec.runtime.native.decoder import Decoder
    from specdec.runtime.native.decoder_weights import build
    from specdec.runtime.native.rotary import rotary_tables
    from specdec.runtime.native.stored_weights import load_weights, save_weights
    from specdec.runtime.native.weight_source import HEAD

    model = tiny("qwen2")
    tokens = sequence(12)
    ids = torch.arange(0, VOCAB, 3)
    for mode in ("int4", "int3"):
        cfg = decoder_config(model.config)
        source = read_model(model, cfg, mode)
        save_weights(build(cfg, source, mode), source.linears[HEAD], tmp_path / f"{mode}.safetensors")
        for head in (None, ids):
            lms = [NativeLM(Decoder(w, lambda n: rotary_tables(cfg, n), 64), (), None)
                   for w in (build(cfg, source, mode, head), load_weights(tmp_path / f"{mode}.safetensors", cfg, head))]
            assert torch.equal(lms[0].forward(tokens), lms[1].forward(tokens)), (mode, head is None)
            assert lms[1].decoder.weights.forms == source.forms


def test_the_non_finite_flag_names_the_first_bad_row():
    """nonfinite_at: -1 while every logit is finite, else the position of the first row with a
    NaN or inf (a NaN in one token's embedding row: its row and those after it see it)."""
    model = tiny(layers=2)
    lm = from_transformers(copy.deepcopy(model), "int4", capacity=64)
    tokens = torch.arange(10, 30)
    lm.forward(tokens[:12])
    assert int(lm.nonfinite_at) == -1
    lm.decoder.weights.embedding[tokens[15]] = float("nan")  # the C structs read this tensor
    lm.forward(tokens[12:20])
    assert int(lm.nonfinite_at) == 15


def test_the_cache_grows_keeping_every_bit_and_stops_at_the_models_positions(pair):
    """A cache of 8 slots grows under a prefill, a block and a tree: every row as with room
    to spare, and what it held before kept; past max_position_embeddings a one-line error."""
    model, roomy = pair
    tokens = sequence(60)
    single = alone(roomy, tokens)
    lm = from_transformers(copy.deepcopy(model), "int4", capacity=8)
    assert torch.equal(lm.prefill(tokens[:11]), single[10:11]) and lm.decoder.capacity == 16
    assert torch.equal(lm.forward(tokens[11:20]), single[11:20]) and lm.decoder.capacity == 32
    lm.trim(18)
    assert torch.equal(lm.forward(tokens[18:31]), single[18:31]) and lm.decoder.capacity == 32
    parents = torch.tensor([-1, 0, 1, -1])  # the true path 32, 33, 34 under the root 31, and a branch
    nodes = torch.stack([tokens[32], tokens[33], tokens[34], (tokens[32] + 1) % VOCAB])
    with pytest.raises(SpecdecError, match="scores 5 tokens"):  # the root left out: not rows read past the end
        lm.forward_tree(nodes, parents)
    rows = lm.forward_tree(torch.cat([tokens[31:32], nodes]), parents)
    assert lm.decoder.capacity == 64 and torch.equal(rows[:4], single[31:35])
    lm.keep_positions(31, [0, 1, 2, 3])
    assert torch.equal(lm.forward(tokens[35:60]), single[35:60])
    assert lm.kv_bytes(60) == 2 * 2 * 60 * 2 * 32 * 2 and lm.kv_bytes() == lm.kv_bytes(64)  # binary16
    short = from_transformers(tiny(max_position_embeddings=24), "int4", capacity=8)
    short.prefill(tokens[:24])
    with pytest.raises(SpecdecError, match="past the model's 24"):
        short.forward(tokens[24:25])


def test_refused_configs():
    refused = {"rope_parameters.rope_type": dict(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                   "rope_theta": 10000.0}),
               "hidden_act": dict(hidden_act="gelu"), "head_dim": dict(num_attention_heads=8)}
    for field, extra in refused.items():
        with pytest.raises(SpecdecError, match=field):
            from_transformers(tiny("llama", **extra), "int4")
    with pytest.raises(SpecdecError, match="int8, int4, int3"):
        from_transformers(tiny(), "none")


def test_restricted_head_scores_its_ids_only():
    model = tiny()
    full = from_transformers(copy.deepcopy(model), "int4", capacity=32)
    ids = torch.tensor([0, 3, 4, 17, 40, 41, 42, 90, 95])  # 9: the packed head pads to 16 rows
    small = from_transformers(copy.deepcopy(model), "int4", capacity=32, head_ids=ids)
    assert small.vocab_size == 9 and torch.equal(small.head_ids, ids)
    tokens = sequence(10)
    assert torch.equal(small.prefill(tokens), full.prefill(tokens)[:, ids])


def test_an_int3_draft_runs_q3_layers_on_the_weights_its_codes_stand_for():
    """int3: every layer Q3 (3-bit codes, the kernels' Q3 path), the output layer Q4, fewer
    bytes than int4; its logits near transformers' forward on the dequantized Q3/Q4 weights:
    the int8 activations' rounding, amplified through the layers, is 8% of the logits' range on
    this random model (int4 on it: 5.6%), so 12% bounds it; a misread code is of the range itself."""
    model = tiny(layers=3)
    lm = from_transformers(copy.deepcopy(model), "int3", capacity=64)
    w = lm.decoder.weights
    bits = {p.bits for layer in w.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down) for p in x.parts}
    assert bits == {3} and [p.bits for p in w.head.parts] == [4]
    assert all(f.startswith("Q3 rounded") for n, f in w.forms.items() if n != "lm_head")
    assert w.nbytes() < 0.85 * from_transformers(copy.deepcopy(model), "int4", capacity=64).decoder.weights.nbytes()
    assert gap_to_dequantized(model, lm, "int3") <= 0.12


@pytest.mark.parametrize("proposer", ["draft", "draft-head", "draft-int3", "lookup", "tree"])
def test_greedy_speculative_equals_plain_decoding(proposer):
    model = tiny(layers=3)
    target = from_transformers(copy.deepcopy(model), "int4", capacity=256)
    prompt = torch.cat([sequence(12), sequence(12)])  # repeats: prompt lookup finds n-grams
    plain = generate(target, prompt, max_new_tokens=60, eos_token_id=[], check=True).new_tokens
    head = torch.arange(0, VOCAB, 2) if proposer == "draft-head" else None
    drafter = PromptLookup(k=4) if proposer == "lookup" else None
    if drafter is None:
        mode = "int3" if proposer == "draft-int3" else "int4"
        draft = DraftModel(from_transformers(perturbed(model, seed=2, scale=0.2), mode, capacity=256, head_ids=head), k=3)
        drafter = TreeDraft(draft, width=2) if proposer == "tree" else draft
    result = generate(target, prompt, drafter=drafter, max_new_tokens=60, eos_token_id=[], check=True)
    assert result.new_tokens == plain
    assert result.stats.proposed > 0  # verify blocks of several rows ran
    if proposer != "lookup":  # a random model rarely repeats its prompt; the draft agrees often
        assert result.stats.accepted > 0


def test_the_runtime_choice_says_why_native_cannot_run_a_model():
    from specdec.runtime.choose import unfit, use_native

    assert use_native("auto", "smollm2-135m-instruct", "int4", "cpu")
    assert not use_native("auto", "smollm2-135m-instruct", "none", "cpu")  # dense: transformers' model
    assert not use_native("hf", "smollm2-135m-instruct", "int4", "cpu")
    assert "on the CPU" in unfit("smollm2-135m-instruct", "int8", "cuda")
    assert "registry models" in unfit("some/folder", "int4", "cpu")
    with pytest.raises(SpecdecError, match="--runtime native: it runs int4 or int8 weights"):
        use_native("native", "smollm2-135m-instruct", "none", "cpu")
    assert use_native("auto", "smollm2-135m-instruct", "int3", "cpu")
    from specdec.models.quant_options import check_options

    with pytest.raises(SpecdecError, match="int3 weights run on specdec's native runtime only"):
        check_options("int3", 32)  # what a draft on transformers' model (--runtime hf) meets


@pytest.mark.real
def test_the_cli_runs_target_and_draft_on_the_native_runtime_and_speculation_is_exact(capsys):
    """generate --runtime auto with int4 weights: both models on the native runtime (their
    load lines say so), and the int4 draft's output equals plain decoding's bit for bit."""
    import json

    from specdec.cli import main

    base = ["generate", "--target", "smollm2-135m-instruct", "--draft", "smollm2-135m-instruct",
            "--target-quant", "int4", "--prompt", "def fib(n):", "--raw", "--max-new-tokens", "24", "--json"]
    outs = []
    for proposer in ("none", "draft:k=3:quant=int4", "draft:k=2:quant=int4:vocab=8192"):
        assert main([*base, "--proposer", proposer]) == 0
        captured = capsys.readouterr()
        assert "on the native runtime (int4" in captured.err
        outs.append(json.loads(captured.out)["new_tokens"])
    assert outs[1] == outs[0] and outs[2] == outs[0]


# --- real weights -------------------------------------------------------------------------------

SMOLLM, QWEN_TARGET, QWEN_DRAFT = "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def natives():
    """Registry models on the native runtime, loaded once per (name, mode, head)."""
    from specdec.runtime import load_gguf

    loaded = {}

    def get(name: str, mode: str = "int4", head: int | None = None):
        if (name, mode, head) not in loaded:
            ids = None
            if head is not None:
                from specdec.models.draft_head import bundled_text_tokens, frequent_tokens
                from specdec.models.load import load_tokenizer

                tokenizer = load_tokenizer(name)
                ids = frequent_tokens(bundled_text_tokens(tokenizer), head, len(tokenizer), tokenizer.all_special_ids)
            loaded[name, mode, head] = load_gguf(name, mode, head_ids=ids)
        return loaded[name, mode, head]

    return get


def code_prompts(name: str, count: int) -> list[torch.Tensor]:
    from specdec.models.load import load_tokenizer
    from specdec.prompts.chat import encode_prompt
    from specdec.prompts.datasets import dataset_path, read_prompts

    tokenizer = load_tokenizer(name)
    return [torch.tensor(encode_prompt(tokenizer, p.text)) for p in read_prompts(dataset_path("humaneval"))[:count]]


@pytest.mark.real
@pytest.mark.parametrize("name", [SMOLLM, QWEN_DRAFT])
def test_real_logits_match_transformers_on_the_same_weights(natives, name):
    """transformers' float32 forward of the converted folder with every weight replaced by the
    runtime's (the Q4/Q5/Q8 layers installed on the same kernels, the embedding the GGUF's blocks
    decode to, norms and biases read from the GGUF): the same arithmetic but for float order outside the kernels.
    That order still moves int8 activations by a step now and then, and 30 layers amplify it:
    transformers' own logits for the same tokens differ by up to 0.87 (SmolLM2, of a range of
    43) between a forward of 40 and of 64 rows on the Zen 4. Where its forward gives the same
    bits in any block (the Zen 3: a floor of 0), the floor is what rounding the input once
    moves the logits by (the embeddings times 1 +- 2^-24: 2.09 for SmolLM2, 0.48 for the 0.5B
    there). The bound is 4x the larger floor, with the same greedy token at nearly every
    position (measured: SmolLM2 2.1 against 0.87 on the Zen 4, 2.42 against 2.09 on the Zen 3,
    argmax equal at 63-64 of 64). SmolLM2 (Llama) checks the q/k row order too."""
    from transformers import AutoModelForCausalLM

    from specdec.registry import REGISTRY, converted_folder, gguf_file
    from specdec.runtime.native.weight_source import EMBEDDING, EMBEDDING_TABLE, read_gguf

    lm = natives(name)
    folder = converted_folder(REGISTRY[name])
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    source = read_gguf(gguf_file(name), decoder_config(reference.config), "int4")
    table = source.linears.pop(EMBEDDING_TABLE, None)  # the GGUF's own blocks, decoded per row natively
    with torch.no_grad():
        params = dict(reference.named_parameters())
        for key, value in source.dense.items():
            params[key].copy_(value)
        if table is not None:
            params[EMBEDDING].copy_(table.dequantize())
    install(reference, source.linears)
    tokens = code_prompts(name, 1)[0][:64]
    with torch.no_grad(), cache_as_the_runtimes(reference):
        expected = reference(tokens[None]).logits[0].float()
        floor = (reference(tokens[None, :40]).logits[0].float() - expected[:40]).abs().max()
        embeddings = reference.get_input_embeddings()(tokens[None])
        signs = torch.randint(0, 2, embeddings.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
        rounded = reference(inputs_embeds=embeddings * (1 + 2.0**-24 * signs)).logits[0].float()
        floor = max(floor, (rounded - expected).abs().max())
    lm.reset()
    got = lm.forward(tokens)
    assert (got - expected).abs().max() <= 4 * floor
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.95


def _greedy_equal(target, drafters: dict, prompts: list[torch.Tensor], new: int) -> None:
    for prompt in prompts:
        plain = generate(target, prompt, max_new_tokens=new, eos_token_id=[], check=True).new_tokens
        for label, make in drafters.items():
            result = generate(target, prompt, drafter=make(), max_new_tokens=new, eos_token_id=[], check=True)
            assert result.new_tokens == plain, label
            assert result.stats.accepted > 0, label


@pytest.mark.real
def test_real_greedy_speculative_equals_plain_smollm2(natives):
    target, draft = natives(SMOLLM), natives(SMOLLM, "int8")
    _greedy_equal(target, {"lookup": lambda: PromptLookup(k=4), "draft:int8": lambda: DraftModel(draft, k=3),
                           "tree": lambda: TreeDraft(DraftModel(draft, k=3), width=2)},
                  code_prompts(SMOLLM, 2), 48)


@pytest.mark.real
def test_real_greedy_speculative_equals_plain_qwen_pair(natives):
    """The int4 1.5B target with the int4 0.5B draft (full head and 32768 ids), the int3 one
    (32768 ids) and lookup."""
    target, full, small = natives(QWEN_TARGET), natives(QWEN_DRAFT), natives(QWEN_DRAFT, head=32768)
    lean = natives(QWEN_DRAFT, "int3", head=32768)
    _greedy_equal(target, {"lookup": lambda: PromptLookup(k=4), "draft": lambda: DraftModel(full, k=3),
                           "draft:vocab=32768": lambda: DraftModel(small, k=3),
                           "draft:quant=int3:vocab=32768": lambda: DraftModel(lean, k=3)},
                  code_prompts(QWEN_TARGET, 2), 64)


@pytest.mark.real
def test_real_batched_decoding_equals_each_prompt_alone(natives):
    """Four HumanEval prompts decoded together on the int4 1.5B target, plain and with the int3
    draft (confidence floor 0.6, the default's), under the plan measured on these models and
    without one: every output equal to the prompt's plain decoding alone, bit for bit."""
    from specdec.decode.plan import measured_plan
    from specdec.decode.scheduler import decode_together
    from specdec.decode.sequence import Options
    from specdec.proposers.policy import ConfidenceFloor

    target, lean = natives(QWEN_TARGET), natives(QWEN_DRAFT, "int3", head=32768)
    prompts = code_prompts(QWEN_TARGET, 4)
    alone = [generate(target, p, max_new_tokens=48, eos_token_id=[]).new_tokens for p in prompts]
    drafter = DraftModel(lean, k=4, policy=ConfidenceFloor(0.6))
    options = Options(48, eos_token_id=[], check=True)
    for label, proposer, plan in (("plain", None, None), ("draft", drafter, None),
                                  ("planned", drafter, measured_plan(target, drafter))):
        together = decode_together(target, prompts, proposer, options, plan)
        assert [r.new_tokens for r in together] == alone, label


def test_advise_measures_on_the_native_runtime():
    """run_advise over a native target: the bytes a step reads are the runtime's packed weights
    and binary16 K/V (counted by hand here), its costs are timed through its own forward and
    plain decoding calibrated on it. (Native drafts come from the registry's GGUFs, and with a
    draft something pays and is confirmed: the real advise test in test_advise_sweep.py.)"""
    from specdec.methods.build import Drafts
    from specdec.methods.spec import Method, parse
    from specdec.tune.advise import AdviseSettings, run_advise

    model = tiny(layers=3)
    target = from_transformers(copy.deepcopy(model), "int4", capacity=64)
    families = [Method("lookup", ngram=2)]
    prompts = [sequence(20, seed=s).tolist() for s in (1, 2)]
    settings = AdviseSettings(context=80, k_max=3, calibration_k=3, prompts=2, tokens=10, repeats=1, confirm=2)
    advice = run_advise(target, Drafts(None), families, None, settings, prompts)
    w = target.decoder.weights
    packed = sum(p.nbytes() for layer in w.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)
                 for p in x.parts) + sum(p.nbytes() for p in w.head.parts)
    small = sum(t.numel() * 4 for t in [w.final_norm, *(n for x in w.layers for n in (x.attn_norm, x.mlp_norm)),
                                        *(b for x in w.layers for b in x.qkv.biases)])
    kv = 2 * 3 * 80 * 2 * 32 * 2  # K and V, 3 layers, 80 positions, 2 heads of 32, binary16
    assert advice.memory["target"] == {"weights": packed + small, "kv_cache": kv} and advice.dtype == "float32"
    assert advice.bandwidth["bytes_per_step"] == packed + small + kv
    assert advice.c_target > 0 and sorted(advice.verify) == [1, 2, 3]
    assert list(advice.calibration) == list(advice.proposers) == ["lookup:ngram=2"]
    assert advice.plain_tokens_per_s > 0
    for c in advice.confirmed:
        assert c.plain_tokens_per_s > 0 and c.measured_speedup == pytest.approx(c.tokens_per_s / c.plain_tokens_per_s)
    assert parse(advice.choice.method).kind in {"ar", "lookup"}


def test_the_caches_binary16_rounds_to_nearest_even_on_both_paths():
    """decoder.cpp stores keys and values as IEEE binary16: its conversion (F16C where the CPU has
    it) and the portable one both give torch's rounding bit for bit, over normals, exact ties,
    subnormals, overflow and infinities, and read back to the values the bits stand for."""
    from specdec.runtime.native.decoder import library

    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4096, generator=gen) * torch.pow(10.0, torch.randint(-9, 6, (4096,), generator=gen).float())
    halves = torch.randint(0, 0x7C00, (1024,), generator=gen, dtype=torch.int32).to(torch.int16).view(torch.float16)
    above = (halves.view(torch.int16) + 1).view(torch.float16)
    ties = (halves.float() + above.float()) / 2  # exactly between two binary16 neighbours
    edges = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24,
                          2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 1e-30, -1e-30])
    x = torch.cat([wide, ties, edges])
    x = torch.cat([x, torch.zeros(-x.numel() % 16)]).contiguous()
    expected = x.half()
    for portable in (0, 1):
        bits = torch.empty(x.numel(), dtype=torch.int16)
        back = torch.empty_like(x)
        library().sd_decoder_half(x.data_ptr(), bits.data_ptr(), back.data_ptr(), x.numel(), portable)
        assert torch.equal(bits, expected.view(torch.int16)), portable
        assert torch.equal(back, expected.float()), portable
    nan, bits, back = torch.full((16,), float("nan")), torch.empty(16, dtype=torch.int16), torch.empty(16)
    for portable in (0, 1):
        library().sd_decoder_half(nan.data_ptr(), bits.data_ptr(), back.data_ptr(), 16, portable)
        assert bits.view(torch.float16).isnan().all() and back.isnan().all(), portable
