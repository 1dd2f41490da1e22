"""Linear layers for specdec's forward: weights prepacked once for oneDNN where the CPU supports
the dtype, and a row's result independent of the block it is computed in.

A GEMM library picks its kernel by the number of rows: bf16 oneDNN rounds a 1-row input
differently from a block (AVX-512 BF16 machines), MKL's float32 GEMM rounds blocks of 2-3 rows
differently from 4+ (and is 2-3x slower on AMD CPUs), so a token decoded alone and the same token
verified in a block of k+1 would get different logits. Measured (docs/forward.md): oneDNN's
prepacked float32 kernel keeps a row's bits in any block of 1..17 rows and reads the weights
near the memory bandwidth; bf16 `F.linear` without native bf16 keeps them too.

Which blocks agree is a property of the kernel on this machine, so each layer shape is probed
once when a model is packed (`min_rows`): if a 1-row input rounds differently, every 1-row input
is padded to two rows; if blocks of 2..17 rows disagree, `min_rows` is None and specdec refuses
to use the model as a target (tests/test_invariance.py asserts the same property on the machine
that runs the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F


# Blocks the probe compares: every size a verify block of k <= 16 guesses takes.
PROBE_ROWS = tuple(range(1, 18))


@cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN can prepack and run linear weights of `dtype` on this CPU (bf16 needs
    AVX-512 BW/VL/DQ or AVX-NE-CONVERT; float32 runs everywhere oneDNN does)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 2)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8, dtype=dtype), packed, None, "none", [None], "")
    except RuntimeError:
        return False
    return True


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W prepacked for oneDNN (CPU, where it supports the dtype) or kept
    plain for `F.linear` (other devices and dtypes); inputs of fewer than `min_rows` rows are
    padded with zero rows (None: no block size keeps a row's bits, see probe_min_rows).

    The prepacked weight is an opaque oneDNN tensor: it replaces the plain one (no second copy of
    the weights), so a packed layer can be copied but no longer quantized or cut."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype | None = None):
        super().__init__()
        weight = linear.weight.detach()
        if dtype is not None:
            weight = weight.to(dtype)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = weight.dtype
        bias = linear.bias.detach().to(weight.dtype) if linear.bias is not None else None
        self.packed = weight.device.type == "cpu" and onednn_packs(weight.dtype)
        with torch.no_grad():
            stored = torch.ops.mkldnn._reorder_linear_weight(weight, 2) if self.packed else weight
        # Buffers, not parameters: nothing here is trained, and an opaque tensor has no storage
        # that state_dict or parameter counting could read.
        self.register_buffer("weight", stored, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        key = (self.packed, self.in_features, self.out_features, self.dtype, weight.device, bias is not None)
        if key not in _MIN_ROWS:
            _MIN_ROWS[key] = probe_min_rows(self._compute, self.in_features, self.dtype, weight.device)
        self.min_rows = _MIN_ROWS[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        count = rows.shape[0]
        if count < (self.min_rows or 1):
            rows = torch.cat([rows, rows.new_zeros(self.min_rows - count, self.in_features)])
        return self._compute(rows)[:count].reshape(*shape[:-1], self.out_features)

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, "none", [None], "")
        return F.linear(rows, self.weight, self.bias)

    def weight_bytes(self) -> int:
        """Bytes of the weights a forward reads (an opaque tensor has no storage to ask)."""
        return (self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)) \
            * self.dtype.itemsize

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        # deepcopy's default would read the opaque tensor's storage, which it has none of.
        twin = PackedLinear.__new__(PackedLinear)
        torch.nn.Module.__init__(twin)
        twin.in_features, twin.out_features, twin.dtype = self.in_features, self.out_features, self.dtype
        twin.packed, twin.min_rows = self.packed, self.min_rows
        for name, buffer in self._buffers.items():
            twin.register_buffer(name, None if buffer is None else buffer.clone(), persistent=False)
        memo[id(self)] = twin
        return twin

    def extra_repr(self) -> str:
        kernel = "oneDNN prepacked" if self.packed else "F.linear"
        return f"{self.in_features} -> {self.out_features}, {self.dtype}, {kernel}, min_rows={self.min_rows}"


# probe_min_rows's finding per (packed, in, out, dtype, device, bias): one probe per layer shape.
_MIN_ROWS: dict[tuple, int | None] = {}


@torch.inference_mode()
def probe_min_rows(compute: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype,
                   device: torch.device) -> int | None:
    """1 if every row of random input gets the same bits alone and in blocks of 2..17 rows at any
    position; 2 if only the blocks of 2..17 rows agree; None if they do not."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(PROBE_ROWS), in_features, generator=gen).to(dtype=dtype, device=device)
    widest = compute(x)
    for m in PROBE_ROWS[1:-1]:
        if not torch.equal(compute(x[:m]), widest[:m]):
            return None
    return 1 if torch.equal(compute(x[:1]), widest[:1]) else 2
