"""Tiny random models for fast tests. Real weights live in tests marked `real`."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from hypothesis import settings

# Wall-clock deadlines make property tests flaky on a loaded 2-core machine; sizes stay bounded
# by each strategy instead.
settings.register_profile("specdec", deadline=None)
settings.load_profile("specdec")

# scripts/test.sh runs two pytest-xdist workers on CI's two cores: one thread each, as two
# processes of two threads would oversubscribe the cores (OpenMP's waits then cost milliseconds
# per tiny op). What a user's thread count does to a kernel's block invariance is checked at run
# time by the probe in specdec.runtime.hf.linear, and measured by scripts/measure/kernel_facts.py.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_model(seed: int, vocab: int = 64, layers: int = 2, init: float = 0.2) -> Qwen2ForCausalLM:
    """A float32 Qwen2 with a large init so logits are spread out: near-ties between the
    serial and the block computation (float32 rounding, ~1e-6) then practically never occur."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).eval()


def perturbed(model: Qwen2ForCausalLM, seed: int, scale: float) -> Qwen2ForCausalLM:
    """A draft that agrees with `model` often but not always: its weights plus noise."""
    from specdec.runtime.hf.model_facts import is_prepared

    assert not is_prepared(model), "perturb a model before specdec runs it (its linear weights are repacked then)"
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp_min(1e-3))
    return draft


@pytest.fixture(scope="session")
def target() -> Qwen2ForCausalLM:
    return tiny_model(1)


@pytest.fixture(scope="session")
def draft(target) -> Qwen2ForCausalLM:
    return perturbed(target, seed=2, scale=0.3)



def word_tokenizer(vocab: int, prefix: str = "w"):
    """A word-level tokenizer whose tokens are w0..w{vocab-1}, for running the CLI offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"{prefix}{i}": i for i in range(vocab)}, unk_token=f"{prefix}0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=f"{prefix}0")


@pytest.fixture
def tiny_registry(monkeypatch, target):
    """Makes load_model serve tiny models by name: "tiny" (the target), "tiny-draft" (a draft
    that agrees with it often but not always), "other" (another vocabulary). transformers picks a tokenizer class by model type, so a tiny folder could not
    carry a word-level tokenizer; folder loading itself is tested in test_models.py."""
    from specdec.models import load as models

    # Fresh models (the session's target has the same weights, but may have been repacked by a
    # run already, and a repacked model cannot be made an int8 or restricted-head draft).
    served = {"tiny": (tiny_model(1), word_tokenizer(64)),
              "tiny-draft": (perturbed(tiny_model(1), seed=2, scale=0.1), word_tokenizer(64)),
              "other": (tiny_model(5, vocab=32), word_tokenizer(32, "x"))}

    def fake_load(name, dtype="auto", device="cpu", trust_remote_code=False, quant="none", group=32):
        if name not in served:
            return real_load(name, dtype, device, trust_remote_code, quant, group)
        assert quant == "none", "the tiny registry serves dense models only"
        model, tokenizer = served[name]
        return copy.deepcopy(model), tokenizer  # a command may change its draft in place (int8)

    real_load, real_check = models.load_model, models.check_name
    monkeypatch.setattr(models, "load_model", fake_load)
    monkeypatch.setattr(models, "check_name", lambda name: None if name in served else real_check(name))
    return served


@pytest.fixture(autouse=True)
def private_advice(monkeypatch, tmp_path_factory):
    """Saved advice (specdec.tune.saved) goes to a fresh folder per test, never the user's cache; the
    converted real models stay where they are."""
    from specdec.tune import saved

    folder = tmp_path_factory.mktemp("advice")
    monkeypatch.setattr(saved, "advice_dir", lambda: folder)



@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module: tiny models decode fastest so (two threads contend with
    the other test worker's processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
