"""Tiny random models for fast tests. Real weights live in tests marked `real`."""

from __future__ import annotations

import copy

import pytest
import torch
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
