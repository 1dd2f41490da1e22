"""The shapes of a Llama-family model the native decoder runs (DecoderConfig), from a GGUF
file's metadata (specdec.gguf) or a Hugging Face config; one it cannot run exactly is refused
by the field that rules it out. Below both the GGUF reader and the runtimes, and free of torch:
resolving a model's form at start-up reads it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import SpecdecError

if TYPE_CHECKING:  # the GGUF path builds a DecoderConfig without importing transformers
    from transformers import PretrainedConfig

ARCHITECTURES = {"llama": False, "qwen2": True, "qwen3": False}  # model_type -> q/k/v carry biases


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
    rope_theta: float = 10000.0
    qk_norm: bool = False  # an RMSNorm over each q and k head before rotary (Qwen3)
    rope_factors: tuple[float, ...] | None = None  # per-frequency divisors (Llama 3's rope_freqs)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> DecoderConfig:
        factors = fields.get("rope_factors")
        return cls(**{**fields, "rope_factors": None if factors is None else tuple(factors)})

    def check(self) -> DecoderConfig:
        """Self, or a SpecdecError naming the shape the decoder cannot take."""
        if self.model_type not in ARCHITECTURES:
            raise SpecdecError(f"architecture {self.model_type!r}: specdec's native runtime runs "
                               f"{', '.join(ARCHITECTURES)} models; use --runtime hf with a Hugging Face folder")
        if self.head_dim % 32 or self.heads % self.kv_heads:
            raise SpecdecError(f"head_dim {self.head_dim} with {self.heads} heads and {self.kv_heads} K/V heads: the "
                               "native runtime needs head_dim a multiple of 32 and whole groups of query heads")
        for field in ("hidden", "inter"):
            if getattr(self, field) % 32:
                raise SpecdecError(f"{field} size {getattr(self, field)} is not a multiple of 32 (the kernels' blocks)")
        if self.rope_factors is not None and len(self.rope_factors) != self.head_dim // 2:
            raise SpecdecError(f"{len(self.rope_factors)} rotary frequency factors for head_dim {self.head_dim}; "
                               f"expected {self.head_dim // 2}")
        return self


def decoder_config(config: PretrainedConfig) -> DecoderConfig:
    """The decoder's shapes, or a SpecdecError naming the config field it cannot honour."""
    kind = config.model_type
    if kind not in ARCHITECTURES:
        raise SpecdecError(f"model_type {kind!r}: specdec's native runtime runs {', '.join(ARCHITECTURES)} "
                           "models only; use the transformers runtime")
    _refuse(config)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return DecoderConfig(kind, config.num_hidden_layers, config.hidden_size, heads, kv_heads, head_dim,
                         config.intermediate_size, config.vocab_size, float(config.rms_norm_eps),
                         ARCHITECTURES[kind], bool(config.tie_word_embeddings),
                         getattr(config, "max_position_embeddings", None), float(theta), kind == "qwen3").check()


def _refuse(config: PretrainedConfig) -> None:
    """Features the decoder does not compute (it would give other logits, not an error)."""
    rope = getattr(config, "rope_parameters", None) or {}
    checks = {
        "hidden_act": (getattr(config, "hidden_act", "silu"), "silu"),
        "rope_parameters.rope_type": (rope.get("rope_type", "default"), "default"),
        "attention_bias": (getattr(config, "attention_bias", False) and config.model_type != "qwen2", False),
        "mlp_bias": (getattr(config, "mlp_bias", False), False),
        "use_sliding_window": (getattr(config, "use_sliding_window", False), False),
    }
    for field, (value, wanted) in checks.items():
        if value != wanted:
            raise SpecdecError(f"config {field} = {value!r}: specdec's native runtime supports {wanted!r} only")
