"""Quantized linear weights in the two layouts torch's weight-only CPU kernels take, made either
from a GGUF block format (kept exactly where it maps) or by rounding a float weight.

int4: codes q in [0, 15] per element, and per group of `group` consecutive inputs of a row a
scale s and a zero z, so that w = (q - 8) * s + z (`torch.ops.aten._weight_int4pack_mm_for_cpu`).
GGUF's Q4_K (super-blocks of 256 = 8 groups of 32, each with 6-bit scale and min under fp16
super-scales) is w = d*sc*q - dmin*m: the same form with s = d*sc, z = 8*s - dmin*m, so a Q4_K
tensor maps onto int4 groups of 32 without requantizing (s and z stored in float32); so does
Q4_1 (blocks of 32 with an fp16 scale d and min m, w = d*q + m: s = d, z = m + 8d).
int8: codes in [-127, 127] with one scale per output row (`torch.ops.aten._weight_int8pack_mm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ..errors import SpecdecError

INT4_GROUPS = (32, 64, 128, 256)  # group sizes the int4 kernel takes


@dataclass
class Int4Weight:
    codes: torch.Tensor  # uint8 [out, in], values 0..15
    scales: torch.Tensor  # float32 [out, in / group]
    zeros: torch.Tensor  # float32 [out, in / group]
    group: int

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the codes stand for."""
        expand = lambda t: t.repeat_interleave(self.group, dim=1)
        return (self.codes.float() - 8) * expand(self.scales) + expand(self.zeros)


@dataclass
class Int8Weight:
    codes: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # float32 [out]

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.scales[:, None]


def int4_rtn(weight: torch.Tensor, group: int = 32) -> Int4Weight:
    """Round a float weight to int4, per group of `group` inputs: each group's range [min, max]
    spread over the 16 codes (asymmetric, round to nearest)."""
    out_features, in_features = weight.shape
    if group not in INT4_GROUPS or in_features % group:
        raise SpecdecError(f"int4 groups must be one of {INT4_GROUPS} and divide the layer's {in_features} "
                           f"inputs; got {group}")
    w = weight.float().reshape(out_features, in_features // group, group)
    low, high = w.amin(-1), w.amax(-1)
    scales = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15)
    # w = q * s + low = (q - 8) * s + (low + 8 s)
    return Int4Weight(codes.to(torch.uint8).reshape(out_features, in_features), scales, low + 8 * scales, group)


def int8_rtn(weight: torch.Tensor) -> Int8Weight:
    """Round a float weight to int8 per output row (symmetric: the row's largest |w| is 127)."""
    w = weight.float()
    scales = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(codes, scales)


def q4k_to_int4(blocks: np.ndarray, shape: tuple[int, int]) -> Int4Weight:
    """A GGUF Q4_K tensor's raw bytes ([rows, bytes per row] uint8) as int4 groups of 32, exact."""
    out_features, in_features = shape
    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K][1]  # bytes of a 256-element block
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = quants.Q4_K.get_scale_min(raw[:, 4:16])
    scales = d * sc.astype(np.float32)  # [blocks, 8]
    mins = dmin * m.astype(np.float32)
    # 4 chunks of 32 bytes: low nibbles are the chunk's first group of 32, high nibbles its second
    qs = raw[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = (qs & 0x0F).reshape(out_features, in_features)
    scales = torch.from_numpy(scales.reshape(out_features, -1))
    mins = torch.from_numpy(mins.reshape(out_features, -1))
    return Int4Weight(torch.from_numpy(codes), scales, 8 * scales - mins, 32)


def q41_to_int4(blocks: np.ndarray, shape: tuple[int, int]) -> Int4Weight:
    """A GGUF Q4_1 tensor's raw bytes as int4 groups of 32, exact (SmolLM2's GGUF is Q4_1)."""
    out_features, in_features = shape
    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q4_1][1]  # bytes of a 32-element block
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    # 16 bytes: low nibbles are elements 0..15 of the block, high nibbles 16..31
    qs = raw[:, 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(out_features, in_features)
    scales = torch.from_numpy(d.reshape(out_features, -1))
    return Int4Weight(torch.from_numpy(codes), scales, torch.from_numpy(m.reshape(out_features, -1)) + 8 * scales, 32)
