"""The K/V cache's size: what each decode step reads besides the weights, growing with the context."""

from __future__ import annotations

from typing import Any


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, bytes_per_elem: int = 2) -> int:
    """Bytes of the K and V caches: 2 * L * n * H_kv * d_h * bytes (the 2 is K plus V)."""
    return 2 * num_layers * seq_len * num_kv_heads * head_dim * bytes_per_elem


def kv_cache_bytes_for_config(config: Any, seq_len: int, bytes_per_elem: int = 2) -> int:
    """kv_cache_bytes from a transformers-style config.

    num_key_value_heads falls back to num_attention_heads (models without GQA) and
    head_dim to hidden_size // num_attention_heads; None counts as missing because
    some configs carry the attribute unset.
    """
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_cache_bytes(config.num_hidden_layers, kv_heads, head_dim, seq_len, bytes_per_elem)
