"""The rotary tables of a DecoderConfig's shapes, as the native decoder reads them."""

from __future__ import annotations

import torch

from ...decoder_config import DecoderConfig


def rotary_tables(cfg: DecoderConfig, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [capacity, head_dim / 2] float32 by position, with the operations of
    transformers' default rotary module (its inverse frequencies, one float32 product per angle),
    so the angles are the bits its forward uses; a GGUF's rope_freqs divide the frequencies, as
    llama.cpp does for Llama 3."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if cfg.rope_factors is not None:
        inv_freq = inv_freq / torch.tensor(cfg.rope_factors, dtype=torch.float32)
    angles = torch.arange(capacity).float()[:, None] * inv_freq[None, :]
    return angles.cos().contiguous(), angles.sin().contiguous()
