"""The native decoder (kernels/decoder.cpp) behind ctypes: the model described as C structs over
the loaded tensors, a K/V cache of `capacity` slots per layer (static between growths), and one C
call per forward."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ...errors import SpecdecError
from ...kernels import Packed, library_path
from .decoder_weights import DecoderWeights, Linear

SOURCE = Path(__file__).parents[2] / "kernels" / "decoder.cpp"
_i32, _i64, _f32, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class _Weight(ctypes.Structure):
    _fields_ = [("bits", _i32), ("zero", _i32), ("per_super", _i64), ("K", _i64), ("N", _i64),
                ("codes", _p), ("subs", _p), ("supers", _p), ("bias", _p)]


class _Parts(ctypes.Structure):
    _fields_ = [("part", _Weight * 3), ("count", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Parts), ("gate_up", _Parts), ("o", _Weight), ("down", _Weight),
                ("attn_norm", _p), ("mlp_norm", _p), ("k_cache", _p), ("v_cache", _p), ("q_norm", _p), ("k_norm", _p)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("inter", _i64), ("capacity", _i64), ("eps", _f32), ("attn_scale", _f32),
                ("final_norm", _p), ("cos", _p), ("sin", _p), ("layer", ctypes.POINTER(_Layer)),
                ("head", _Weight)]


class _Visible(ctypes.Structure):
    _fields_ = [("lo", _p), ("prefix", _p), ("start", _p), ("extra", _p), ("split", _p), ("shared", _p)]


@dataclass
class Rows:
    """The rows of one decoder call (int64 tensors, see decoder.cpp): row r is token tokens[r]
    at rotary position positions[r], its K/V written to slot slots[r], seeing its sequence's
    positions j < prefix[r] (at slot shared[r] + j below split[r], else lo[r] + j) then slots
    extra[extra_start[r] : extra_start[r + 1]]; logits are computed for the rows listed in `wanted`."""

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    lo: torch.Tensor
    prefix: torch.Tensor
    split: torch.Tensor
    shared: torch.Tensor
    extra_start: torch.Tensor
    extra: torch.Tensor
    wanted: torch.Tensor

    @staticmethod
    def join(parts: Sequence[Rows]) -> Rows:
        """The rows of several calls as one call's (each part's extras and wanted rows shifted)."""
        if len(parts) == 1:
            return parts[0]
        offsets = [0]
        for part in parts:
            offsets.append(offsets[-1] + part.tokens.numel())
        starts, at = [torch.zeros(1, dtype=torch.long)], 0
        for part in parts:
            starts.append(part.extra_start[1:] + at)
            at += int(part.extra_start[-1])
        return Rows(*(torch.cat([getattr(p, name) for p in parts]) for name in
                      ("tokens", "positions", "slots", "lo", "prefix", "split", "shared")),
                    torch.cat(starts), torch.cat([p.extra for p in parts]),
                    torch.cat([p.wanted + off for p, off in zip(parts, offsets)]))


@cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path(source=SOURCE)))
    lib.sd_decoder_forward.argtypes = [ctypes.POINTER(_Model), _p, _i64, _p, _p, _Visible, _p, _i64, _p]
    lib.sd_decoder_move.argtypes = [ctypes.POINTER(_Model), _p, _p, _i64]
    lib.sd_decoder_timings.argtypes = [_p]
    lib.sd_decoder_half.argtypes = [_p, _p, _p, _i64, ctypes.c_int]
    lib.sd_decoder_forward.restype = lib.sd_decoder_move.restype = lib.sd_decoder_timings.restype = None
    lib.sd_decoder_half.restype = None
    return lib


STAGES = ("norm", "qkv", "rope", "attention", "o", "gate_up", "silu", "down", "head")


def stage_seconds() -> dict[str, float]:
    """Seconds each stage of decoder.cpp took since the last call (a step's profile)."""
    out = (ctypes.c_double * len(STAGES))()
    library().sd_decoder_timings(out)
    return dict(zip(STAGES, out))


def _weight(packed: Packed, bias: torch.Tensor | None) -> _Weight:
    out_features = packed.codes.shape[0] * 16
    return _Weight(packed.bits, packed.zero, packed.per_super, packed.in_features, out_features,
                   packed.codes.data_ptr(),
                   packed.subs.data_ptr(), packed.supers.data_ptr(), None if bias is None else bias.data_ptr())


def _single(linear: Linear) -> _Weight:
    return _weight(linear.parts[0], linear.biases[0])


def _parts(linear: Linear) -> _Parts:
    parts = _Parts()
    for i, (packed, bias) in enumerate(zip(linear.parts, linear.biases)):
        parts.part[i] = _weight(packed, bias)
    parts.count = len(linear.parts)
    return parts


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _optional(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


Rotary = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # capacity -> cos, sin [capacity, head_dim / 2]


class Decoder:
    """The loaded weights and a K/V cache of `capacity` slots, run by decoder.cpp; `grow` moves
    the cache to more slots (the C structs point into the new tensors)."""

    def __init__(self, weights: DecoderWeights, rotary: Rotary, capacity: int):
        self.weights, self._rotary = weights, rotary
        self.head_rows = weights.head_rows
        self.head_width = weights.head.parts[0].codes.shape[0] * 16
        self._lib = library()
        self.capacity = 0
        self.grow(capacity, keep=0)

    def grow(self, capacity: int, keep: int) -> None:
        """A cache of `capacity` slots holding the first `keep` slots of the current one."""
        cfg = self.weights.config
        with torch.inference_mode(False):  # a cache grown inside a draft's proposal lives on outside it
            # decoder.cpp's layout and element (IEEE binary16)
            k_cache = torch.zeros(cfg.layers, cfg.kv_heads, capacity, cfg.head_dim, dtype=torch.float16)
            v_cache = torch.zeros_like(k_cache)
            if keep:
                k_cache[:, :, :keep] = self.k_cache[:, :, :keep]
                v_cache[:, :, :keep] = self.v_cache[:, :, :keep]
            cos, sin = self._rotary(capacity)
        self.k_cache, self.v_cache, self.capacity = k_cache, v_cache, capacity
        self._keep = (cos, sin)  # tensors the C structs point into live as long as they do
        w = self.weights
        layers = (_Layer * cfg.layers)()
        for i, lw in enumerate(w.layers):
            layers[i] = _Layer(_parts(lw.qkv), _parts(lw.gate_up), _single(lw.o), _single(lw.down),
                               _ptr(lw.attn_norm), _ptr(lw.mlp_norm), _ptr(k_cache[i]), _ptr(v_cache[i]),
                               _optional(lw.q_norm), _optional(lw.k_norm))
        self._layers = layers
        self.model = _Model(cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter, capacity,
                            cfg.eps, cfg.head_dim ** -0.5, _ptr(w.final_norm),
                            _ptr(cos), _ptr(sin), layers, _single(w.head))
        self._model_ref = ctypes.byref(self.model)

    def kv_bytes(self, slots: int | None = None) -> int:
        """Bytes of keys and values in the first `slots` slots of every layer (None: all allocated)."""
        layers, heads, _, dim = self.k_cache.shape
        per_slot = 2 * layers * heads * dim * self.k_cache.element_size()
        return per_slot * (self.capacity if slots is None else slots)

    def forward(self, rows: Rows) -> torch.Tensor:
        """Logits [len(rows.wanted), head rows] float32 of the wanted rows."""
        embedded = self.weights.embed(rows.tokens).contiguous()
        if int(rows.slots.max()) >= self.capacity or int(rows.positions.max()) >= self.capacity:
            raise SpecdecError(f"a forward past the native runtime's {self.capacity} cache slots (NativeLM grows "
                               "the cache first)")
        logits = torch.empty(rows.wanted.numel(), self.head_width)
        visible = _Visible(_ptr(rows.lo), _ptr(rows.prefix), _ptr(rows.extra_start), _ptr(rows.extra),
                           _ptr(rows.split), _ptr(rows.shared))
        self._lib.sd_decoder_forward(self._model_ref, _ptr(embedded), rows.tokens.numel(), _ptr(rows.positions),
                                     _ptr(rows.slots), visible, _ptr(rows.wanted), rows.wanted.numel(), _ptr(logits))
        return logits if self.head_rows == self.head_width else logits[:, : self.head_rows]

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy cache slots source[i] -> target[i] in every layer, in order (where the two
        overlap: ascending, target <= source)."""
        self._lib.sd_decoder_move(self._model_ref, _ptr(source), _ptr(target), source.numel())
