"""A GGUF file's linear weights by the Hugging Face module they belong to: Q4_K and Q4_1 tensors
as exact Q4 weights, Q6_K as exact Q8 ones, every other type dequantized exactly to float32 (for
rounding).

Names follow llama.cpp's convention for the Qwen2/Llama family (blk.N.attn_q ...); each decoded
tensor is checked against the same weight in the dense model that transformers dequantized from
this file, so a wrong name or layout fails at conversion, not in a wrong answer later.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants

from ..errors import SpecdecError
from .gguf_blocks import q4k_split, q5k_split, q6k_split, q40_split, q41_split, q50_split, q51_split, q80_split
from .heap import return_freed_memory
from .weights import Q4Weight, Q8Weight, tensor_fields

_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


# GGUF block types that are specdec's Q4, Q5 or Q8 weights as they are (quant.weights)
_T = GGMLQuantizationType
EXACT = {_T.Q4_0: q40_split, _T.Q4_1: q41_split, _T.Q5_0: q50_split, _T.Q5_1: q51_split, _T.Q8_0: q80_split,
         _T.Q4_K: q4k_split, _T.Q5_K: q5k_split, _T.Q6_K: q6k_split}

Decoded = Q4Weight | Q8Weight | torch.Tensor


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face module name of a GGUF weight tensor, None for non-linear tensors."""
    if gguf_name == "output.weight":
        return "lm_head"
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if match and match.group(2) in _LAYER:
        return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}"
    return None


def linear_weights(path: Path | GGUFReader, keep: Callable[[str], bool] = lambda name: True
                   ) -> Iterator[tuple[str, str, Decoded]]:
    """(module name, GGUF type name, weight) for every linear weight in the file (or its open
    reader) whose module name `keep` accepts: a Q4Weight or Q8Weight for the EXACT types, else
    the float32 tensor [out, in] the blocks stand for."""
    reader = path if isinstance(path, GGUFReader) else GGUFReader(str(path))
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None or not keep(name):
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists dims inner first
        kind = tensor.tensor_type
        if kind in EXACT:
            yield name, kind.name, decode_exact(kind, tensor.data, shape)
        else:
            dense = np.asarray(quants.dequantize(tensor.data, kind), dtype=np.float32).reshape(shape)
            yield name, kind.name, torch.from_numpy(dense)


_CHUNK_ROWS = 8192  # rows split at once: a split's temporaries are several times its result


def decode_exact(kind: GGMLQuantizationType, data: np.ndarray, shape: tuple[int, int]) -> Q4Weight | Q8Weight:
    """An EXACT type's tensor (raw bytes [rows, bytes per row]) as its specdec weight, split a
    chunk of rows at a time (a 151,936-row embedding's temporaries would otherwise take 1-2 GB)."""
    rows = shape[0]
    first = EXACT[kind](data[:_CHUNK_ROWS], (min(_CHUNK_ROWS, rows), shape[1]))
    if rows <= _CHUNK_ROWS:
        return first
    # Each chunk written into the whole weight's tensors as it is split: collecting the chunks and
    # concatenating them held the weight twice (the peak of a cold conversion, 2.5 GB on one CI machine).
    whole = {f: getattr(first, f).new_empty((rows, *getattr(first, f).shape[1:])) for f in tensor_fields(first)}
    part = first
    for at in range(0, rows, _CHUNK_ROWS):
        if at:
            part = EXACT[kind](data[at : at + _CHUNK_ROWS], (min(_CHUNK_ROWS, rows - at), shape[1]))
        for f, tensor in whole.items():
            tensor[at : at + _CHUNK_ROWS] = getattr(part, f)
        del part
        return_freed_memory()
    return dataclasses.replace(first, **whole)


def matching(name: str, weight: Decoded, dense: torch.Tensor, heads: int | None) -> Decoded:
    """The decoded weight in the row order of `dense`, the weight transformers dequantized from
    the same file (specdec's cache stores it in bfloat16). llama.cpp stores a Llama model's q and
    k rows interleaved for its rotary layout (`heads`: that projection's head count), which
    transformers undoes; so is tried here. Raises if neither order matches."""
    for candidate in (weight, rows_unpermuted(weight, heads) if heads else None):
        if candidate is None:
            continue
        decoded = candidate if isinstance(candidate, torch.Tensor) else candidate.dequantize()
        if decoded.shape == dense.shape and torch.equal(decoded.bfloat16(), dense.bfloat16()):
            return candidate
    raise SpecdecError(
            f"{name}: the weight decoded from the GGUF file differs from transformers' dequantization of "
            "the same file (an architecture whose GGUF layout specdec does not map yet); use --target-quant "
            "with a Hugging Face folder instead"
        )


def rows_unpermuted(weight: Decoded, heads: int) -> Decoded:
    """Undo llama.cpp's per-head interleave of rotary rows (rows [h, d/2, 2] -> [h, 2, d/2]), as
    transformers' GGUF loader does."""
    def fix(t: torch.Tensor) -> torch.Tensor:
        rows = t.shape[0]
        return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)

    if isinstance(weight, torch.Tensor):
        return fix(weight)
    return dataclasses.replace(weight, **{name: fix(getattr(weight, name)) for name in tensor_fields(weight)})
