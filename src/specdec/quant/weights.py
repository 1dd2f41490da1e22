"""Quantized linear weights in the two forms specdec's kernels take (specdec.kernels), made
either from a GGUF block format (kept exactly where it maps) or by rounding a float weight.

Both are two-level, as llama.cpp's K-quants are: integer sub-scales per small group of inputs
under float32 scales per super-block of 256 inputs of a row (a row's last super-block may be
shorter), which is what makes them cheap to read (4.75 and 8.6 bits per weight, 6.6 for Q6_K's
codes, which the kernels store in 6 bits).
- Q4Weight: 4-bit codes q in [0, 15], groups of 32 with an unsigned sub-scale sc and sub-min mn,
  super-scales d and dmin: w = d*sc*q - dmin*mn. GGUF's Q4_K is exactly this (its 6-bit sc and
  mn); so is its Q4_1 (w = d*q + m per group of 32) with one group per super-block, sc = mn = 1
  and dmin = -m (a float scale and min per group: 6 bits per weight). With bits = 3 the codes
  lie in [0, 7] and all else is the same, one super-block per row (3.5 bits per weight): a
  draft's form (q3_rtn), which need not be exact, only cheap to read.
  With bits = 5 (codes in [0, 31]) it is GGUF's Q5_K exactly, and Q5_0 (w = d*(q - 16)) and
  Q5_1 (w = d*q + m) with one group per super-block; Q4_0 (w = d*(q - 8)) is bits = 4 so.
- Q8Weight: 8-bit codes q in [0, 255] around a zero z (one per tensor), groups of 16 with a
  signed sub-scale sc under a super-scale d per `per_super` groups: w = d*sc*(q - z). GGUF's
  Q6_K is exactly this with z = 32 (bits = 6: the kernels store its codes in 6 bits); its Q8_0 (w = d*q per 32) with z = 128, sc = 1 and a
  super-block of 2 groups; rounding a float weight ("int8") uses z = 128 and codes in [1, 255].
Every GGUF form is read from the file's bytes (quant.gguf_blocks) and decodes to gguf-py's floats
bit for bit (tests/test_kernels.py): a model in these forms is the file's model, not a rounding of it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ..errors import SpecdecError

SUPER = 256  # inputs per super-block
Q4_GROUP, Q8_GROUP = 32, 16  # inputs per sub-scale
INT4_GROUPS = (32, 64, 128, 256)  # group sizes a float weight can be rounded to int4 in


@dataclass
class Q4Weight:
    codes: torch.Tensor  # uint8 [out, in], 0..15
    sub_scales: torch.Tensor  # uint8 [out, in / 32]
    sub_mins: torch.Tensor  # uint8 [out, in / 32]
    scales: torch.Tensor  # float32 [out, super-blocks]
    mins: torch.Tensor  # float32 [out, super-blocks]
    per_super: int = SUPER // Q4_GROUP  # groups per super-block
    bits: int = 4  # codes in [0, 2**bits)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the codes stand for (GGUF's own order of operations)."""
        scale = _scale(self.scales, self.sub_scales, self.per_super)
        return self.codes.float() * _per_input(scale, Q4_GROUP) \
            - _per_input(_scale(self.mins, self.sub_mins, self.per_super), Q4_GROUP)


@dataclass
class Q8Weight:
    codes: torch.Tensor  # uint8 [out, in]
    sub_scales: torch.Tensor  # int8 [out, in / 16]
    scales: torch.Tensor  # float32 [out, super-blocks]
    zero: int
    per_super: int = SUPER // Q8_GROUP  # groups per super-block

    def dequantize(self) -> torch.Tensor:
        scale = _scale(self.scales, self.sub_scales, self.per_super)
        return _per_input(scale, Q8_GROUP) * (self.codes.float() - self.zero)

    @functools.cached_property
    def bits(self) -> int:
        """6 where every code fits 6 bits around the zero 32 (Q6_K's: the kernels then store a
        code in 6 bits, 3/4 of the bytes a decode step reads), else 8."""
        return 6 if self.zero == 32 and int(self.codes.max()) < 64 else 8


def _scale(per_super: torch.Tensor, subs: torch.Tensor, groups: int) -> torch.Tensor:
    """Each group's float step: its super-block's value (`groups` groups to a block) times its
    sub-value, in float32 as the kernels compute it."""
    return per_super.repeat_interleave(groups, dim=1)[:, : subs.shape[1]] * subs.float()


def _per_input(per_group: torch.Tensor, group: int) -> torch.Tensor:
    return per_group.repeat_interleave(group, dim=1)


def fits(in_features: int, out_features: int) -> bool:
    """Whether the kernels take a layer of this shape: outputs in tiles of 16, inputs in whole
    activation blocks of 32."""
    return out_features % 16 == 0 and in_features % Q4_GROUP == 0


def _two_level(values: torch.Tensor, groups: int, top: int, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group float values [out, G] as integer sub-values times a float per super-block of
    `groups` groups: (sub-values, super-values), the largest sub-value of a block `top`."""
    out, count = values.shape
    blocks = -(-count // groups)
    padded = torch.nn.functional.pad(values, (0, blocks * groups - count)).reshape(out, blocks, groups)
    tops = padded.abs().amax(-1) / top
    safe = tops.clamp_min(torch.finfo(torch.float32).tiny)
    subs = torch.round(padded / safe[..., None]).clamp(-top if signed else 0, top)
    return subs.reshape(out, -1)[:, :count].to(torch.int8 if signed else torch.uint8), tops


def q4_rtn(weight: torch.Tensor, group: int = 32) -> Q4Weight:
    """Round a float weight to Q4 with each group of `group` inputs spread over its range
    [min(0, low), high] (asymmetric, round to nearest): its scale and min, rounded to 8-bit
    sub-values under super-scales, are shared by the group's 32-input sub-groups."""
    out_features, in_features = weight.shape
    if group not in INT4_GROUPS or in_features % group:
        raise SpecdecError(f"int4 groups must be one of {INT4_GROUPS} and divide the layer's {in_features} "
                           f"inputs; got {group}")
    w = weight.float().reshape(out_features, in_features // group, group)
    low, high = w.amin(-1).clamp_max(0), w.amax(-1)
    repeat = group // Q4_GROUP
    return _affine(weight, ((high - low) / 15).repeat_interleave(repeat, dim=1),
                   (-low).repeat_interleave(repeat, dim=1), 4, SUPER // Q4_GROUP)


# Shares of a group's range [low, high] that q3_rtn tries (each end shrunk alike): with 8 levels,
# clipping the rare extremes of a group lowers its squared error more often than with 16.
_Q3_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def q3_rtn(weight: torch.Tensor) -> Q4Weight:
    """Round a float weight to 3-bit codes in groups of 32 (Q4Weight with bits = 3): per group
    the range [min(0, low), high], shrunk by the one of _Q3_SHRINK whose rounding has the least
    squared error, then refitted by least squares to its codes (scale and min, the min kept <= 0).
    One super-block per row: 8-bit sub-scales under the row's largest lose nothing measurable
    here (the 0.5B draft's layers: relative error 0.1385 either way), and save 0.25 bits a weight."""
    out_features, in_features = weight.shape
    if in_features % Q4_GROUP:
        raise SpecdecError(f"int3 rounds groups of {Q4_GROUP} inputs; the layer has {in_features}")
    w = weight.float().reshape(out_features, -1, Q4_GROUP)
    low, high = w.amin(-1, keepdim=True).clamp_max(0), w.amax(-1, keepdim=True)
    best_err = best_step = best_floor = None
    for shrink in _Q3_SHRINK:
        step, floor = ((high - low) * shrink / 7), -low * shrink
        q = torch.where(step > 0, torch.round((w + floor) / step.clamp_min(1e-30)), 0).clamp(0, 7)
        step, floor = _refit(w, q, step, floor)
        err = ((q * step - floor - w) ** 2).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_step, best_floor = err, step, floor
            continue
        better = err < best_err
        best_err, best_step, best_floor = (torch.where(better, a, b) for a, b in
                                           ((err, best_err), (step, best_step), (floor, best_floor)))
    return _affine(weight, best_step.squeeze(-1), best_floor.squeeze(-1), 3, in_features // Q4_GROUP)


def _refit(w: torch.Tensor, q: torch.Tensor, step: torch.Tensor, floor: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The least-squares step and floor of w ~ q*step - floor per group, floor >= 0 and step >= 0
    (where the fit is degenerate, the given ones)."""
    n = w.shape[-1]
    sq, sw, sqq, sqw = q.sum(-1, keepdim=True), w.sum(-1, keepdim=True), (q * q).sum(-1, keepdim=True), \
        (q * w).sum(-1, keepdim=True)
    det = n * sqq - sq * sq
    fit_step = (n * sqw - sq * sw) / det.clamp_min(1e-30)
    fit_floor = (fit_step * sq - sw) / n
    ok = (det > 0) & (fit_step > 0) & (fit_floor >= 0)
    return torch.where(ok, fit_step, step), torch.where(ok, fit_floor, floor)


def _affine(weight: torch.Tensor, step: torch.Tensor, floor: torch.Tensor, bits: int, per_super: int) -> Q4Weight:
    """The Q4Weight (codes of `bits` bits) of a float weight [out, in] with each 32-input
    group's step and floor [out, in / 32] (w ~ step*q - floor), both rounded to 8-bit
    sub-values under super-scales of `per_super` groups first and the codes rounded to those."""
    out_features, in_features = weight.shape
    sub_scales, scales = _two_level(step, per_super, 255, signed=False)
    sub_mins, mins = _two_level(floor, per_super, 255, signed=False)
    # Codes for the rounded steps: q = round((w + dmin*mn) / (d*sc)), 0 where the step is 0.
    w = weight.float().reshape(out_features, in_features)
    rounded_step = _per_input(_scale(scales, sub_scales, per_super), Q4_GROUP)
    rounded_floor = _per_input(_scale(mins, sub_mins, per_super), Q4_GROUP)
    codes = torch.where(rounded_step > 0, torch.round((w + rounded_floor) / rounded_step.clamp_min(1e-30)), 0)
    codes = codes.clamp(0, 2**bits - 1)
    return Q4Weight(codes.to(torch.uint8), sub_scales, sub_mins, scales, mins, per_super, bits)


def q8_rtn(weight: torch.Tensor) -> Q8Weight:
    """Round a float weight to Q8 (symmetric per group of 16: the group's largest |w| is 127
    steps from the zero 128; the steps rounded to 7-bit sub-scales under super-scales)."""
    out_features, in_features = weight.shape
    w = weight.float()
    step = w.reshape(out_features, -1, Q8_GROUP).abs().amax(-1) / 127
    sub_scales, scales = _two_level(step, SUPER // Q8_GROUP, 127, signed=True)
    rounded = _per_input(_scale(scales, sub_scales, SUPER // Q8_GROUP), Q8_GROUP)
    codes = torch.where(rounded > 0, torch.round(w / rounded.clamp_min(1e-30)), 0).clamp(-127, 127) + 128
    return Q8Weight(codes.to(torch.uint8), sub_scales, scales, 128)


def tensor_fields(weight: Q4Weight | Q8Weight) -> list[str]:
    """The fields of a weight that hold a tensor [out, ...] (the others are per-tensor constants)."""
    return [f.name for f in dataclasses.fields(weight) if isinstance(getattr(weight, f.name), torch.Tensor)]


def stacked(weights: list[Q4Weight | Q8Weight]) -> Q4Weight | Q8Weight | None:
    """The weights of layers with one input as one layer's (their outputs one after the other),
    or None where their forms differ (Q4 with Q8, another zero or super-block size)."""
    first = weights[0]
    tensors = tensor_fields(first)
    plain = [f.name for f in dataclasses.fields(first) if f.name not in tensors]
    if any(type(w) is not type(first) or w.codes.shape[1] != first.codes.shape[1]
           or any(getattr(w, n) != getattr(first, n) for n in plain) for w in weights):
        return None
    return dataclasses.replace(first, **{name: torch.cat([getattr(w, name) for w in weights]) for name in tensors})
