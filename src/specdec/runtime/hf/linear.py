"""Linear layers for specdec's forward: weights prepacked once for oneDNN where the CPU supports
the dtype, and a row's result independent of the block it is computed in.

A GEMM library picks its kernel by the number of rows: bf16 oneDNN rounds a 1-row input
differently from a block (AVX-512 BF16 machines), MKL's float32 GEMM rounds blocks of 2-3 rows
differently from 4+ (and is 2-3x slower on AMD CPUs), so a token decoded alone and the same token
verified in a block of k+1 would get different logits. Measured (docs/forward.md): oneDNN's
prepacked float32 kernel keeps a row's bits in any block of 2..17 rows and reads the weights
near the memory bandwidth; on an AVX-512 CPU its lone row (float32 and bf16) differs in a few
outputs per 10^4, so 1-row inputs are padded there.

Which blocks agree is a property of the kernel on this machine, so each layer shape is probed
once when a model is packed (`min_rows`): if a 1-row input rounds differently, every 1-row input
is padded to two rows; if blocks of 2..17 rows disagree but a fixed block of 17 keeps a row's
bits, every decode and verify block is padded to 17 rows (a verify block of k <= 16 guesses fits);
if not even that holds, `min_rows` is None and specdec refuses to use the model as a target
(tests/test_invariance.py asserts the same property on the machine that runs the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F

from ... import kernels
from ...errors import SpecdecError
from ...quant.weights import Q4Weight, Q8Weight, fits

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


class BlockLinear(torch.nn.Module):
    """y = x W^T + b by some kernel (`_compute`, over 2-D rows), with the block rule of the
    module docstring: inputs of fewer than `min_rows` rows are padded with zero rows (None: no
    block size keeps a row's bits on this machine, see probe_min_rows). Input rows are cast to
    `dtype`, the kernel's activation dtype, which is also the output's unless `out_dtype` is set
    (quantized layers computing in bf16 inside a float32 model, see quant.model.kernel_dtype)."""

    out_dtype: torch.dtype | None = None

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, bias: torch.Tensor | None,
                 kernel: str):
        super().__init__()
        self.in_features, self.out_features, self.dtype, self.kernel = in_features, out_features, dtype, kernel
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype), persistent=False)

    def _probe(self, device: torch.device) -> None:
        """Find min_rows, once per kernel and layer shape (the weights' values do not decide it)."""
        key = (self.kernel, self.in_features, self.out_features, self.dtype, device, self.bias is not None)
        if key not in _MIN_ROWS:
            _MIN_ROWS[key] = probe_min_rows(self._compute, self.in_features, self.dtype, device)
        self.min_rows = _MIN_ROWS[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        count = rows.shape[0]
        if count < (self.min_rows or 1):
            rows = torch.cat([rows, rows.new_zeros(self.min_rows - count, self.in_features)])
        out = self._compute(rows)[:count].reshape(*shape[:-1], self.out_features)
        return out if self.out_dtype is None else out.to(self.out_dtype)

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_bytes(self) -> int:
        """Bytes a forward reads from the layer's weights (an opaque tensor has no storage to ask)."""
        raise NotImplementedError

    def _bias_bytes(self) -> int:
        return 0 if self.bias is None else self.bias.numel() * self.bias.element_size()

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.dtype}, {self.kernel}, min_rows={self.min_rows}"


class PackedLinear(BlockLinear):
    """A dense layer, its weight prepacked for oneDNN (CPU, where it supports the dtype) or kept
    plain for `F.linear` (other devices and dtypes).

    The prepacked weight is an opaque oneDNN tensor: it replaces the plain one (no second copy of
    the weights), so a packed layer can be copied but no longer quantized or cut."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype | None = None):
        weight = linear.weight.detach().to(dtype or linear.weight.dtype)
        packed = weight.device.type == "cpu" and onednn_packs(weight.dtype)
        super().__init__(linear.in_features, linear.out_features, weight.dtype, linear.bias,
                         "oneDNN prepacked" if packed else "F.linear")
        with torch.no_grad():
            stored = torch.ops.mkldnn._reorder_linear_weight(weight, 2) if packed else weight
        # A buffer, not a parameter: nothing here is trained, and an opaque tensor has no storage
        # that state_dict or parameter counting could read.
        self.register_buffer("weight", stored, persistent=False)
        self.packed = packed
        self._probe(weight.device)

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, "none", [None], "")
        return F.linear(rows, self.weight, self.bias)

    def weight_bytes(self) -> int:
        return self.in_features * self.out_features * self.dtype.itemsize + self._bias_bytes()

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        # deepcopy's default would read the opaque tensor's storage, which it has none of.
        twin = PackedLinear.__new__(PackedLinear)
        torch.nn.Module.__init__(twin)
        for name in ("in_features", "out_features", "dtype", "kernel", "packed", "min_rows"):
            setattr(twin, name, getattr(self, name))
        for name, buffer in self._buffers.items():
            twin.register_buffer(name, None if buffer is None else buffer.clone(), persistent=False)
        memo[id(self)] = twin
        return twin


class QuantLinear(BlockLinear):
    """A Q4 or Q8 layer (quant.weights) on specdec's kernels: activations quantized to int8 per
    row in blocks of 32, integer dot products, float32 sums in a fixed order (specdec.kernels),
    so a row's bits never depend on its block; activations read and outputs written in `dtype`
    (float32 or bfloat16; others go through float32)."""

    def __init__(self, weight: Q4Weight | Q8Weight, bias: torch.Tensor | None, dtype: torch.dtype):
        out_features, in_features = weight.codes.shape
        if not fits(in_features, out_features):
            raise SpecdecError(f"a quantized layer needs outputs in multiples of 16 and inputs in multiples "
                               f"of 32; this one is {in_features} -> {out_features}")
        super().__init__(in_features, out_features, dtype, None, f"q{weight.bits} int8-activation")
        self.weight = kernels.pack(weight)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)
        self._probe(torch.device("cpu"))

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.linear(rows, self.weight, self.bias, self.out_dtype or self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.min_rows != 1:  # the probe found what the kernels promise never to do
            return super().forward(x)
        out = kernels.linear(x.reshape(-1, self.in_features), self.weight, self.bias, self.out_dtype or self.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return self.weight.nbytes() + self._bias_bytes()


class _Shared:
    """The last input of a shared layer and its output, until every part has read it (a plain
    object: attribute writes on a Module cost microseconds, many times a step)."""

    def __init__(self, layer: QuantLinear):
        self.layer, self.input, self.output, self.unread = layer, None, None, 0


class SharedInputPart(torch.nn.Module):
    """One of several layers fed the same input (q/k/v, gate/up), computed as its slice of one
    QuantLinear over their weights stacked: one kernel call and one quantization of the input
    instead of several, and the same bits as the layer alone (the kernels compute each output on
    its own). The first part owns the shared layer (so it is counted once); the result is kept
    until every part has read it, or a different input comes."""

    def __init__(self, shared: QuantLinear, start: int, stop: int, owner: bool, parts: int):
        super().__init__()
        if owner:
            self.shared = shared
            shared.state = _Shared(shared)
        self.state = shared.state
        self.start, self.stop, self.parts = start, stop, parts
        self.in_features, self.out_features = shared.in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        if state.input is not x:
            state.input, state.output, state.unread = x, state.layer(x), self.parts
        out = state.output[..., self.start : self.stop]
        state.unread -= 1
        if state.unread == 0:
            state.input = state.output = None
        return out

    def extra_repr(self) -> str:
        return f"outputs {self.start}:{self.stop} of a shared {self.state.layer.kernel} layer"


# probe_min_rows's finding per (packed, in, out, dtype, device, bias): one probe per layer shape.
_MIN_ROWS: dict[tuple, int | None] = {}

# A kernel path that rounds differently changes only the outputs whose exact value lies near a
# rounding boundary of the output dtype. Measured on oneDNN's bf16 kernels (AMD Zen 5): 1-5 in
# 10^4 outputs of a 1-row input differed from the same row inside a block, so a probe that
# compared one row (1,536 outputs) passed 1536 x 1536 and 1536 x 256 layers that then changed
# greedy outputs of the real target. Each check now compares at least PROBE_OUTPUTS outputs (rows
# of one layer's width, in blocks of the widest size; at most PROBE_MAX_ROWS rows).
PROBE_OUTPUTS = 2**20
PROBE_MAX_ROWS = 2048


@torch.inference_mode()
def probe_min_rows(compute: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype,
                   device: torch.device) -> int | None:
    """The fewest rows every block must be padded to for a row's bits not to depend on the block:
    1 if random rows get the same bits alone and in blocks of 2..17 at any position; 2 if only
    the blocks of 2..17 rows agree; 17 if blocks of different sizes disagree but a block of 17
    keeps a row's bits whatever its position and the other rows (GPU GEMMs choose tiles and
    split-K by the row count: padding is nearly free there, where decoding is memory-bound);
    None if not even that holds."""
    gen = torch.Generator().manual_seed(0)
    widest = max(PROBE_ROWS)
    first = _probe_rows(widest, in_features, gen, dtype, device)
    full = [compute(first)]
    chunks = min(PROBE_MAX_ROWS // widest, -(-PROBE_OUTPUTS // (widest * full[0].shape[-1])))
    blocks = [first] + [_probe_rows(widest, in_features, gen, dtype, device) for _ in range(chunks - 1)]
    full += [compute(block) for block in blocks[1:]]
    if all(torch.equal(compute(block[:m]), out[:m]) for block, out in zip(blocks, full) for m in PROBE_ROWS[1:-1]):
        alone = all(torch.equal(compute(block[i : i + 1]), out[i : i + 1])
                    for block, out in zip(blocks, full) for i in range(widest))
        return 1 if alone else 2
    for block, out in zip(blocks, full):
        shuffled = _probe_rows(widest, in_features, gen, dtype, device)
        shuffled[widest // 2] = block[0]
        if not torch.equal(compute(shuffled)[widest // 2], out[0]):
            return None
    return widest


def _probe_rows(count: int, in_features: int, gen: torch.Generator, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """Random rows whose entries spread over 2^-6..2^6 in magnitude: wider sums than normal
    activations, so that a different order of accumulation shows in more outputs."""
    scale = torch.exp2(torch.randint(-6, 7, (count, in_features), generator=gen).float())
    return (torch.randn(count, in_features, generator=gen) * scale).to(dtype=dtype, device=device)
