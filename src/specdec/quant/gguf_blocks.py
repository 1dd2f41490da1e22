"""GGUF's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) read from a tensor's raw
bytes into the two forms specdec's kernels take (quant.weights), exactly: each decodes to
gguf-py's floats bit for bit (tests/test_kernels.py)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ..errors import SpecdecError
from .weights import Q8_GROUP, Q4Weight, Q8Weight


def q4k_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """A GGUF Q4_K tensor's raw bytes ([rows, bytes per row] uint8) as a Q4Weight, exact."""
    out_features, in_features = shape
    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K][1]  # bytes of a 256-element block
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = quants.Q4_K.get_scale_min(raw[:, 4:16])
    # 4 chunks of 32 bytes: low nibbles are the chunk's first group of 32, high nibbles its second
    qs = raw[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    rows = lambda a, dtype: torch.from_numpy(np.ascontiguousarray(a).astype(dtype).reshape(out_features, -1))
    return Q4Weight(rows(qs & 0x0F, np.uint8), rows(sc, np.uint8), rows(m, np.uint8), rows(d, np.float32),
                    rows(dmin, np.float32))


def q6k_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q8Weight:
    """A GGUF Q6_K tensor's raw bytes as a Q8Weight (codes 0..63 around 32), exact."""
    out_features, in_features = shape
    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q6_K][1]
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)
    ql, qh, sc, d = raw[:, :128], raw[:, 128:192], raw[:, 192:208], raw[:, 208:210]
    # 2 halves of 128: ql's 64 bytes give 4-bit low parts (low nibbles: elements 0..63 of the
    # half, high nibbles 64..127), qh's 32 bytes the 2-bit high parts (4 per byte).
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    codes = low.reshape(-1, 2, 128) | (high.reshape(-1, 2, 128) << 4)
    rows = lambda a, dtype: torch.from_numpy(np.ascontiguousarray(a).view(dtype).reshape(out_features, -1).copy())
    return Q8Weight(rows(codes, np.uint8), rows(sc, np.int8), rows(d, np.float16).float(), 32)


def _blocks(blocks: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """A GGUF tensor's raw bytes as one row per block of `kind`."""
    size = quants.GGML_QUANT_SIZES[kind][1]
    return np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)


def _f16(raw: np.ndarray, at: int, out_features: int) -> torch.Tensor:
    """The fp16 field at byte `at` of every block, float32 [out, blocks per row]."""
    return torch.from_numpy(raw[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(out_features, -1))


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A legacy block's 16 bytes as 32 codes: low nibbles elements 0..15, high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """A legacy block's 4 bytes (a little-endian uint32) as the fifth bit of its 32 codes."""
    return ((qh.copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _one_group(codes: np.ndarray, d: torch.Tensor, mins: torch.Tensor, bits: int, shape: tuple[int, int]) -> Q4Weight:
    """A Q4Weight of one group of 32 per super-block: w = d*q - mins (sub-values 1)."""
    ones = torch.ones(d.shape, dtype=torch.uint8)
    return Q4Weight(torch.from_numpy(codes.reshape(shape)), ones, ones.clone(), d, mins, per_super=1, bits=bits)


def q40_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """GGUF Q4_0 (w = d*(q - 8)) as a Q4Weight, exact: d*q and 8d are exact in float32."""
    raw = _blocks(blocks, GGMLQuantizationType.Q4_0)
    d = _f16(raw, 0, shape[0])
    return _one_group(_nibbles(raw[:, 2:]), d, 8 * d, 4, shape)


def q41_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """GGUF Q4_1 (w = d*q + m) as a Q4Weight of one group per super-block, exact."""
    raw = _blocks(blocks, GGMLQuantizationType.Q4_1)
    return _one_group(_nibbles(raw[:, 4:]), _f16(raw, 0, shape[0]), -_f16(raw, 2, shape[0]), 4, shape)


def q50_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """GGUF Q5_0 (w = d*(q - 16)) as a 5-bit Q4Weight, exact."""
    raw = _blocks(blocks, GGMLQuantizationType.Q5_0)
    d = _f16(raw, 0, shape[0])
    return _one_group(_nibbles(raw[:, 6:]) | (_fifth_bits(raw[:, 2:6]) << 4), d, 16 * d, 5, shape)


def q51_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """GGUF Q5_1 (w = d*q + m) as a 5-bit Q4Weight, exact."""
    raw = _blocks(blocks, GGMLQuantizationType.Q5_1)
    codes = _nibbles(raw[:, 8:]) | (_fifth_bits(raw[:, 4:8]) << 4)
    return _one_group(codes, _f16(raw, 0, shape[0]), -_f16(raw, 2, shape[0]), 5, shape)


def q5k_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """GGUF Q5_K as a 5-bit Q4Weight, exact: Q4_K's scales and nibbles, and a fifth bit per
    code (bit g of byte i of qh: element i of group g)."""
    out_features = shape[0]
    raw = _blocks(blocks, GGMLQuantizationType.Q5_K)
    sc, m = quants.Q4_K.get_scale_min(raw[:, 4:16])
    low = raw[:, 48:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = raw[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    codes = (low.reshape(-1, 8, 32) & 0x0F) | ((high & 1) << 4)
    rows = lambda a: torch.from_numpy(np.ascontiguousarray(a).astype(np.uint8).reshape(out_features, -1))
    return Q4Weight(rows(codes), rows(sc), rows(m), _f16(raw, 0, out_features), _f16(raw, 2, out_features), bits=5)


def q80_split(blocks: np.ndarray, shape: tuple[int, int]) -> Q8Weight:
    """GGUF Q8_0 (w = d*q, q int8 per block of 32) as a Q8Weight around 128, exact. A code of
    -128 (llama.cpp's quantizer writes none: |q| <= 127) is refused: the AVX2 path negates codes."""
    raw = _blocks(blocks, GGMLQuantizationType.Q8_0)
    q = raw[:, 2:].view(np.int8)
    if (q == -128).any():
        raise SpecdecError("a Q8_0 tensor holds the code -128, which specdec's kernels cannot take exactly; "
                           "use --runtime hf")
    codes = torch.from_numpy((q.astype(np.int16) + 128).astype(np.uint8).reshape(shape))
    d = _f16(raw, 0, shape[0])
    return Q8Weight(codes, torch.ones(shape[0], shape[1] // Q8_GROUP, dtype=torch.int8), d, 128, per_super=2)
