"""The native decoder (kernels/decoder.cpp) behind ctypes: the model described once as C
structs over the loaded tensors, a static K/V cache of `capacity` slots per layer, and one C
call per forward."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from ..errors import SpecdecError
from ..kernels import Packed, library_path
from .weights import DecoderWeights, Linear

SOURCE = Path(__file__).parent.parent / "kernels" / "decoder.cpp"
_i32, _i64, _f32, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class _Weight(ctypes.Structure):
    _fields_ = [("bits", _i32), ("zero", _i32), ("per_super", _i64), ("K", _i64), ("N", _i64),
                ("codes", _p), ("subs", _p), ("supers", _p), ("bias", _p)]


class _Parts(ctypes.Structure):
    _fields_ = [("part", _Weight * 3), ("count", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Parts), ("gate_up", _Parts), ("o", _Weight), ("down", _Weight),
                ("attn_norm", _p), ("mlp_norm", _p), ("k_cache", _p), ("v_cache", _p)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("inter", _i64), ("capacity", _i64), ("eps", _f32), ("attn_scale", _f32),
                ("embedding", _p), ("final_norm", _p), ("cos", _p), ("sin", _p), ("layer", ctypes.POINTER(_Layer)),
                ("head", _Weight)]


class _Visible(ctypes.Structure):
    _fields_ = [("prefix", _p), ("start", _p), ("extra", _p)]


@cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path(source=SOURCE)))
    lib.sd_decoder_forward.argtypes = [ctypes.POINTER(_Model), _p, _i64, _p, _p, _Visible, _i64, _p]
    lib.sd_decoder_move.argtypes = [ctypes.POINTER(_Model), _p, _p, _i64]
    lib.sd_decoder_timings.argtypes = [_p]
    lib.sd_decoder_forward.restype = lib.sd_decoder_move.restype = lib.sd_decoder_timings.restype = None
    return lib


STAGES = ("norm", "qkv", "rope", "attention", "o", "gate_up", "silu", "down", "head")


def stage_seconds() -> dict[str, float]:
    """Seconds each stage of decoder.cpp took since the last call (a step's profile)."""
    out = (ctypes.c_double * len(STAGES))()
    library().sd_decoder_timings(out)
    return dict(zip(STAGES, out))


def _weight(packed: Packed, bias: torch.Tensor | None) -> _Weight:
    out_features = packed.codes.shape[0] * 16
    inputs = packed.codes.shape[1] * (32 if packed.bits == 4 else 16)
    return _Weight(packed.bits, packed.zero, packed.per_super, inputs, out_features, packed.codes.data_ptr(),
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


class Decoder:
    """The loaded weights and a K/V cache of `capacity` slots, run by decoder.cpp."""

    def __init__(self, weights: DecoderWeights, cos: torch.Tensor, sin: torch.Tensor, capacity: int):
        cfg = weights.config
        self.weights, self.capacity = weights, capacity
        self.head_rows = weights.head_rows
        self.head_width = weights.head.parts[0].codes.shape[0] * 16
        kv = cfg.kv_heads * cfg.head_dim
        self.k_cache = torch.zeros(cfg.layers, capacity, kv)
        self.v_cache = torch.zeros(cfg.layers, capacity, kv)
        self._keep = (cos, sin)  # tensors the C structs point into live as long as self
        layers = (_Layer * cfg.layers)()
        for i, w in enumerate(weights.layers):
            layers[i] = _Layer(_parts(w.qkv), _parts(w.gate_up), _single(w.o), _single(w.down), _ptr(w.attn_norm),
                               _ptr(w.mlp_norm), _ptr(self.k_cache[i]), _ptr(self.v_cache[i]))
        self._layers = layers
        self.model = _Model(cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter, capacity,
                            cfg.eps, cfg.head_dim ** -0.5, _ptr(weights.embedding), _ptr(weights.final_norm),
                            _ptr(cos), _ptr(sin), layers, _single(weights.head))
        self._lib = library()
        self._model_ref = ctypes.byref(self.model)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, prefix: torch.Tensor,
                extra_start: torch.Tensor, extra: torch.Tensor, first: int) -> torch.Tensor:
        """Logits [n - first, head rows] float32 of the n rows (int64 tensors, see decoder.cpp)."""
        n = tokens.numel()
        if int(slots.max()) >= self.capacity or int(positions.max()) >= self.capacity:
            raise SpecdecError(f"the sequence would exceed the native runtime's {self.capacity} cache slots: "
                               "load it with a larger capacity")
        logits = torch.empty(n - first, self.head_width)
        visible = _Visible(_ptr(prefix), _ptr(extra_start), _ptr(extra))
        self._lib.sd_decoder_forward(self._model_ref, _ptr(tokens), n, _ptr(positions), _ptr(slots), visible,
                                     first, _ptr(logits))
        return logits if self.head_rows == self.head_width else logits[:, : self.head_rows]

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy cache slots source[i] -> target[i] in every layer (ascending, target <= source)."""
        self._lib.sd_decoder_move(self._model_ref, _ptr(source), _ptr(target), source.numel())
