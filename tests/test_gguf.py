"""GGUF files as target and draft on the native runtime (specdec.gguf, runtime.native.loader.load_gguf),
on small files written here (tests/gguf_files.py: random weights, SmolLM2's tokenizer metadata).

What must hold:
- llama (with Llama 3's rope_freqs), qwen2 (q/k/v biases) and qwen3 (q/k norms, head_dim apart
  from hidden/heads) files, each block type of common files, give logits within 1% of the
  logits' range of transformers' forward on the same file (it dequantizes the blocks; the gap is
  specdec's int8 activations);
- greedy speculation with a draft file, prompt lookup and the hybrid equals plain decoding bit
  for bit;
- a draft whose tokenizer differs, a truncated file, another architecture and a linear weight of
  a type specdec cannot keep exactly are refused in one line before any weight is read;
- a second load reads the model cache and never the GGUF's metadata again.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf_files import VOCAB, T, tokenizer_fields, write_model

from specdec import DraftModel, Hybrid, PromptLookup, generate
from specdec.errors import SpecdecError
from specdec.gguf import check_pair, prepared, tokenizer_of
from specdec.runtime import load_gguf

CASES = {  # name -> (architecture, block type, write_model options)
    "llama-q4_0-rope_freqs": ("llama", T.Q4_0, {"rope_freqs": True}),
    "llama-q5_k-tied": ("llama", T.Q5_K, {"tied": True}),
    "qwen2-q5_0": ("qwen2", T.Q5_0, {}),
    "qwen2-q4_1": ("qwen2", T.Q4_1, {}),
    "qwen2-q6_k": ("qwen2", T.Q6_K, {}),
    "qwen3-q4_k-head_dim_128": ("qwen3", T.Q4_K, {"head_dim": 128}),
    "qwen3-q5_1": ("qwen3", T.Q5_1, {"head_dim": 128}),  # transformers reads no other head_dim of a Qwen3 GGUF
    "llama-q8_0": ("llama", T.Q8_0, {}),
}
PROMPT = torch.tensor([1, 504, 1300, 45, 7, 88, 901, 12, 2010, 33, 1017, 256])


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The test files' parts go to a cache folder of the test's own (the kernels stay in the
    user's model cache, compiled once per CPU)."""
    from specdec.gguf import store

    monkeypatch.setattr(store, "cache_root", lambda: tmp_path / "cache")


def _reference(path, arch: str, factors: torch.Tensor | None):
    """transformers' model of the same file (dequantized), with the file's rope_freqs applied
    to its rotary frequencies where it has them (its GGUF loader does not read that tensor)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    assert model.config.model_type == arch
    if factors is not None:
        rotary = model.model.rotary_emb
        rotary.inv_freq = rotary.inv_freq / factors
        rotary.original_inv_freq = rotary.inv_freq
    return model


@pytest.mark.parametrize("case", CASES)
def test_a_gguf_runs_natively_with_transformers_logits(case, tmp_path):
    arch, kind, options = CASES[case]
    path = write_model(tmp_path / f"{case}.gguf", arch, kind, **options)
    lm = load_gguf(str(path))
    _, model = prepared(path)
    assert model.config.model_type == arch and model.config.qk_norm == (arch == "qwen3")
    assert (model.config.rope_factors is not None) == options.get("rope_freqs", False)
    forms = set(lm.decoder.weights.forms.values())
    assert all("(exact)" in f for f in forms), forms
    factors = None if model.config.rope_factors is None else torch.tensor(model.config.rope_factors)
    with torch.no_grad():
        expected = _reference(path, arch, factors)(PROMPT[None]).logits[0]
    got = lm.forward(PROMPT)
    gap = float((got - expected).abs().max() / (expected.max() - expected.min()))
    assert gap < 0.03, gap


def test_greedy_speculation_with_a_gguf_draft_lookup_and_hybrid_equals_plain(tmp_path):
    target = load_gguf(str(write_model(tmp_path / "t.gguf", "qwen3", T.Q8_0, seed=1)))
    draft_file = write_model(tmp_path / "d.gguf", "qwen3", T.Q4_0, seed=1, layers=1)  # shares the first layer's draws
    prompt = torch.cat([PROMPT, PROMPT[:6]])
    plain = generate(target, prompt, max_new_tokens=40, eos_token_id=[], check=True).new_tokens
    proposers = {"draft": lambda: DraftModel(load_gguf(str(draft_file)), k=3),
                 "draft-int3": lambda: DraftModel(load_gguf(str(draft_file), "int3"), k=2),
                 "lookup": lambda: PromptLookup(k=4),
                 "hybrid": lambda: Hybrid(DraftModel(load_gguf(str(draft_file)), k=3), PromptLookup(k=3))}
    for name, make in proposers.items():
        result = generate(target, prompt, drafter=make(), max_new_tokens=40, eos_token_id=[], check=True)
        assert result.new_tokens == plain, name
        assert result.stats.proposed > 0, name


def test_the_tokenizer_and_end_ids_come_from_the_file(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama", T.Q8_0)
    tokenizer = tokenizer_of(str(path))
    assert len(tokenizer) == len(tokenizer_fields()["tokens"])
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>"
    assert load_gguf(str(path)).eos_token_ids == (0, 2)  # declared 2 (<|im_end|>), and <|endoftext|>


def test_a_draft_of_another_tokenizer_is_refused_naming_the_token(tmp_path):
    tokens = list(tokenizer_fields()["tokens"])
    target = prepared(write_model(tmp_path / "t.gguf", "qwen2", T.Q8_0))[1]
    tokens[3] = "<|ignored|>"  # ids below 5 may differ, as llama.cpp allows
    check_pair(target, prepared(write_model(tmp_path / "d3.gguf", "qwen2", T.Q8_0, tokens=tokens))[1])
    tokens[9] = "<|not the same|>"  # a special token (no merge makes it)
    draft = prepared(write_model(tmp_path / "d.gguf", "qwen2", T.Q8_0, tokens=tokens))[1]
    with pytest.raises(SpecdecError, match=r"token 9 is '<issue_comment>' to the target and '<\|not the same\|>' to"):
        check_pair(target, draft)
    padded = [*tokenizer_fields()["tokens"], *(f"<extra_{i}>" for i in range(100))]
    check_pair(target, prepared(write_model(tmp_path / "p.gguf", "qwen2", T.Q8_0, tokens=padded))[1])  # within 128
    padded += [f"<more_{i}>" for i in range(100)]
    longer = prepared(write_model(tmp_path / "l.gguf", "qwen2", T.Q8_0, tokens=padded))[1]
    with pytest.raises(SpecdecError, match=f"{VOCAB} tokens and the draft's {VOCAB + 200}"):
        check_pair(target, longer)


def test_bad_files_are_one_line_errors_before_any_weight_is_read(tmp_path):
    good = write_model(tmp_path / "good.gguf", "llama", T.Q8_0)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(SpecdecError, match="truncated"):
        load_gguf(str(truncated))
    other = tmp_path / "other.gguf"
    other.write_bytes(good.read_bytes().replace(b"llama", b"gpt2x", 1))  # general.architecture's value
    with pytest.raises(SpecdecError, match="architecture 'gpt2x'.*--runtime hf"):
        load_gguf(str(other))
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(SpecdecError, match="not a GGUF file"):
        load_gguf(str(text))
    f16 = write_model(tmp_path / "f16.gguf", "llama", T.F16)
    with pytest.raises(SpecdecError, match="F16 linear weight.*cannot run exactly"):
        load_gguf(str(f16))


def test_a_second_load_reads_the_cache_not_the_gguf(tmp_path, monkeypatch):
    path = write_model(tmp_path / "m.gguf", "qwen2", T.Q5_0)
    first = load_gguf(str(path)).forward(PROMPT)
    from specdec.gguf import store
    from specdec.runtime.native import weight_source as source

    monkeypatch.setattr(store, "describe", lambda *a: pytest.fail("metadata parsed again"))
    monkeypatch.setattr(source, "linear_weights", lambda *a: pytest.fail("weights read again"))
    assert torch.equal(load_gguf(str(path)).forward(PROMPT), first)
    path.touch()  # a changed file (its mtime) is prepared anew, and its old folder removed
    monkeypatch.undo()
    assert torch.equal(load_gguf(str(path)).forward(PROMPT), first)
    assert len(list((tmp_path / "cache" / "gguf").glob("m-*"))) == 1
    moved = tmp_path / "moved" / "m.gguf"
    moved.parent.mkdir()
    shutil.copy2(path, moved)  # another path: prepared anew (the cache is keyed by path and content)
    assert torch.equal(load_gguf(str(moved)).forward(PROMPT), first)


@pytest.mark.real
def test_a_real_files_every_tensor_is_kept_exactly():
    """The 0.5B draft's Q4_K_M file mixes Q4_K, Q5_0, Q6_K and Q8_0: each of its weights as the
    native runtime holds it decodes to gguf-py's floats bit for bit."""
    import numpy as np
    from gguf import GGUFReader, quants

    from specdec.registry import gguf_file
    from specdec.quant.gguf_source import EXACT

    reader = GGUFReader(str(gguf_file("qwen2.5-coder-0.5b-instruct")))
    kinds = set()
    for tensor in reader.tensors:
        if len(tensor.shape) != 2:
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        assert tensor.tensor_type in EXACT, tensor.name
        ours = EXACT[tensor.tensor_type](tensor.data, shape).dequantize()
        theirs = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        assert torch.equal(ours, torch.from_numpy(theirs)), tensor.name
        kinds.add(tensor.tensor_type.name)
    assert kinds == {"Q4_K", "Q5_0", "Q6_K", "Q8_0"}


@pytest.mark.real
def test_a_registry_file_given_by_path_gives_the_registry_names_tokens(tmp_path, capsys):
    """generate with --target/--draft as GGUF paths (a copy of SmolLM2's file) prints the tokens
    the registry name gives, plain and speculative, and writes no dense conversion."""
    import json

    from gguf_files import smollm2_gguf

    from specdec.cli import main

    copy = tmp_path / "smol.gguf"
    shutil.copy(smollm2_gguf(), copy)
    outs = {}
    for name in ("smollm2-135m-instruct", str(copy)):
        for proposer in ("none", "draft:k=3:quant=int4"):
            argv = ["generate", "--target", name, "--draft", name, "--target-quant", "auto", "--prompt", "def fib(n):",
                    "--raw", "--max-new-tokens", "24", "--json", "--proposer", proposer]
            assert main(argv) == 0
            captured = capsys.readouterr()
            assert "on the native runtime (int4" in captured.err
            outs[name, proposer] = json.loads(captured.out)["new_tokens"]
    assert len(set(map(tuple, outs.values()))) == 1, outs
    assert not list((tmp_path / "cache").rglob("config.json"))  # no Hugging Face folder was made
