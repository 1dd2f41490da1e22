"""The shapes of a Llama-family model the native decoder runs, read from its Hugging Face
config; a config it cannot run exactly is refused by the field that rules it out."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from ..errors import SpecdecError

ARCHITECTURES = {"llama": False, "qwen2": True}  # model_type -> q/k/v carry biases


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    qkv_bias: bool
    tied: bool  # the output layer is the embedding
    max_positions: int | None


def decoder_config(config: PretrainedConfig) -> DecoderConfig:
    """The decoder's shapes, or a SpecdecError naming the config field it cannot honour."""
    kind = config.model_type
    if kind not in ARCHITECTURES:
        raise SpecdecError(f"model_type {kind!r}: specdec's native runtime runs {', '.join(ARCHITECTURES)} "
                           "models only; use the transformers runtime")
    _refuse(config)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim % 32 or heads % kv_heads or heads * head_dim != config.hidden_size:
        raise SpecdecError(f"head_dim {head_dim} with {heads} heads of hidden_size {config.hidden_size}: the "
                           "native runtime needs head_dim a multiple of 32 and heads * head_dim = hidden_size")
    for field in ("hidden_size", "intermediate_size"):
        if getattr(config, field) % 32:
            raise SpecdecError(f"{field} {getattr(config, field)} is not a multiple of 32 (the kernels' blocks)")
    return DecoderConfig(kind, config.num_hidden_layers, config.hidden_size, heads, kv_heads, head_dim,
                         config.intermediate_size, config.vocab_size, float(config.rms_norm_eps),
                         ARCHITECTURES[kind], bool(config.tie_word_embeddings),
                         getattr(config, "max_position_embeddings", None))


def _refuse(config: PretrainedConfig) -> None:
    """Features the decoder does not compute (it would give other logits, not an error)."""
    rope = getattr(config, "rope_parameters", None) or {}
    checks = {
        "hidden_act": (getattr(config, "hidden_act", "silu"), "silu"),
        "rope_parameters.rope_type": (rope.get("rope_type", "default"), "default"),
        "attention_bias": (getattr(config, "attention_bias", False) and config.model_type == "llama", False),
        "mlp_bias": (getattr(config, "mlp_bias", False), False),
        "use_sliding_window": (getattr(config, "use_sliding_window", False), False),
    }
    for field, (value, wanted) in checks.items():
        if value != wanted:
            raise SpecdecError(f"config {field} = {value!r}: specdec's native runtime supports {wanted!r} only")


def rotary_tables(config: PretrainedConfig, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [capacity, head_dim / 2] float32 by position, computed by transformers' own
    rotary module, so the angles are the ones its forward uses."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(capacity)[None]
    probe = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(probe, positions)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()
