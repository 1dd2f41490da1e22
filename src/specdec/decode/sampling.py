"""Logits -> probabilities. The same transform is applied to the target's p and the draft's q,
so that the rejection rule compares the distributions the tokens are actually drawn from.

The filters, in this order (as transformers' and llama.cpp's chains), on the logits divided by
the temperature:
- top-k: keep the tokens whose logit is >= the k-th largest (ties with it are all kept).
- top-p: order the tokens by logit, descending, ties by token id ascending; keep the token at
  position j when the mass before it, sum of p over positions < j, is < top_p (p: the softmax
  of the logits after top-k). So the nucleus is the smallest such prefix, at least one token.
- min-p (llama.cpp's): keep the tokens with p >= min_p * p_max, evaluated as llama.cpp does
  on logits: logit >= max logit + log(min_p). The max is never filtered out, so applying it
  last just intersects its set with the others'.

None of them sorts the vocabulary (docs/sampling.md). top-p sorts only its candidates, a
prefix of that order that holds every token the filters can keep: p >= (1 - top_p - 2^-8) / V
(the tokens below hold less than 1 - top_p - 2^-8 of the mass, so each of them has top_p
before it), and with min-p p >= min_p * p_max / 2. Their mass is the same float32 cumulative
sum, in the same order, as a sort of the whole row gives. Only softmax's float32 normaliser is
summed in vocabulary order instead of sorted order (up to ~1e-5 apart at 151,936 tokens), so
a token whose mass before it lies within that of top_p can come out either way in either
implementation; ties never do. Rows whose candidates are many (flat rows; top_p > 1 - 2^-8)
sort more, at worst the whole row. Extracting the candidates reads their count back to the host
(a synchronisation on CUDA, top-p only). Rows with NaN come out NaN, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import SpecdecError

# A temperature below this samples greedily (vLLM's _SAMPLING_EPS): logits divided by 1e-300
# overflow float32 to inf/NaN, and a draw from those returns the vocabulary's last id.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = 0.0  # 0 or None: off

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise SpecdecError(f"temperature must be >= 0 (below {GREEDY_BELOW:g}: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise SpecdecError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise SpecdecError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p < 1:
            raise SpecdecError(f"min_p must be in [0, 1), got {self.min_p}: 0 turns it off, 0.05 keeps "
                               "the tokens at least 1/20 as likely as the most likely one")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Sampling distribution over the last dimension after temperature, top-k, top-p and min-p."""
    return torch.softmax(filtered(logits / cfg.temperature, cfg), dim=-1)


def filtered(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`logits` (already divided by the temperature) with the tokens that cfg's filters drop
    set to -inf."""
    if cfg.top_k is not None and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1:
        return _nucleus(logits, cfg.top_p, cfg.min_p or 0.0)
    if cfg.min_p:
        logits = logits.masked_fill(logits < _min_p_floor(logits, cfg.min_p), float("-inf"))
    return logits


def _min_p_floor(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """The lowest logit min-p keeps, per row: max logit + log(min_p), in the logits' dtype."""
    return logits.amax(-1, keepdim=True) + math.log(min_p)


# Candidates of the nucleus have p >= (1 - top_p - _SLACK) / V. Their mass is then >= top_p +
# _SLACK less the float32 rounding of the softmax's normaliser (< 2e-3 even summed badly), so
# the mass before every token outside reaches top_p. Above top_p = 1 - _SLACK all tokens are
# candidates (a full sort).
_SLACK = 2.0**-8


def _nucleus(logits: torch.Tensor, top_p: float, min_p: float) -> torch.Tensor:
    """top-p (then min-p when min_p > 0) on rows of logits: the tokens outside set to -inf.

    The candidates are a prefix of the order (logit descending, id ascending) that holds every
    token the filters can keep: p >= the bound above, and when min_p is set p >= min_p * p_max
    / 2 (the factor 1/2 covers the rounding between that and the logit test of min-p). Only
    they are sorted; their cumulative sum is the prefix of the one over the whole sorted row."""
    rows = logits.reshape(-1, logits.shape[-1])
    p = torch.softmax(rows, dim=-1)
    bound = max(0.0, 1.0 - top_p - _SLACK) / rows.shape[-1]
    if min_p:
        candidate = p >= torch.clamp_min(p.amax(-1, keepdim=True) * (min_p / 2), bound)
    else:
        candidate = p >= bound if bound > 0 else rows > float("-inf")
    r, c = candidate.nonzero(as_tuple=True)  # row-major: ids ascending within a row
    values = rows[r, c]
    # Logit descending within each row, ties by id ascending: two stable sorts.
    order = torch.sort(values, descending=True, stable=True).indices
    order = order[torch.sort(r[order], stable=True).indices]
    r, c, values = r[order], c[order], values[order]
    # Each row's candidates side by side, zero-padded, for a cumulative sum per row.
    counts = torch.bincount(r, minlength=rows.shape[0])
    at = torch.arange(r.numel(), device=r.device) - (counts.cumsum(0) - counts)[r]
    grid = p.new_zeros(rows.shape[0], int(counts.max()) if r.numel() else 0)
    grid[r, at] = p[r, c]
    before = grid.cumsum(-1) - grid
    keep = ~(before >= top_p)[r, at]
    if min_p:
        keep &= values >= _min_p_floor(rows, min_p)[r, 0]
    out = torch.full_like(rows, float("-inf"))
    out[r, c] = torch.where(keep, values, float("-inf"))
    return out.view(logits.shape)


def pick(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token from one logits row: argmax when greedy, else a draw from `probs`."""
    if cfg.greedy:
        return logits.argmax(-1, keepdim=True)
    return draw(probs(logits, cfg), generator)


# Tokens per block of draw's two-level search.
_BLOCK = 1024


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index drawn with probability proportional to `weights` (1-D, non-negative, not all
    zero), shape [1], as torch.multinomial(weights, 1) but without its host synchronisation
    (it reads the input's validity back on CUDA) and about 15x faster on a CPU for a 150k
    vocabulary. Inverse-CDF over cumulative sums in float64, two-level (blocks, then tokens
    within the chosen block) so that the sums stay short: a float32 cumsum over the whole
    vocabulary would misplace ~1e-3 of the mass; a token of weight 0 is never drawn."""
    wide = torch.float32 if weights.device.type == "mps" else torch.float64
    u = torch.rand(2, generator=generator, device=weights.device, dtype=wide)
    if weights.numel() <= _BLOCK:
        return _invert(weights.to(wide).cumsum(0), u[0])
    blocks = torch.nn.functional.pad(weights.to(wide), (0, -weights.numel() % _BLOCK)).view(-1, _BLOCK)
    block = _invert(blocks.sum(-1).cumsum(0), u[0])
    within = _invert(blocks.index_select(0, block)[0].cumsum(0), u[1])
    return block * _BLOCK + within


def _invert(cumulative: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative weight exceeds u * total, shape [1]. The target stays
    below the total even where u * total rounds up, so the index has positive weight."""
    total = cumulative[-1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    # NaN weights (bad logits, reported by the engine afterwards) must still give a valid index.
    return torch.searchsorted(cumulative, target, right=True).clamp_max(cumulative.numel() - 1)
