"""How many tokens each running sequence guesses in a round of a batch (decode.batch.Plan): the
cost model's rate, tokens committed per second, over the whole batch's round.

A round of the batch costs one target forward over every sequence's block (k_s + 1 rows each,
C_V(sum)) plus the draft steps: step j forwards one row for each sequence that guesses at least
j tokens (C_D(rows)). Sequence s commits E_s(k) = 1 + a_s + ... + a_s^k tokens in expectation,
with a_s its own acceptance per judged guess so far (a prior until its rounds say more). The plan
raises one sequence's k at a time, by whatever step gives the best rate of the batch, while that
rate grows; so plain rows (k = 0) where guessing does not pay for the rows it adds, guesses
where it does. A sequence whose draft has fallen behind (plain rounds, or only the prompt's first
token read: decode.batch) first pays the draft's catch-up block, a one-time cost the plan spreads
over the rounds the sequence has left. The costs are measured on the models at hand
(measured_plan: a second or two at a server's start), never assumed.

The plan depends only on earlier rounds and on measured costs, never on the target's
distribution of the round it plans, so sampling stays exact (as adaptive k's policies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .sequence import Decoding

PRIOR, PRIOR_WEIGHT = 0.6, 4.0  # acceptance assumed before a sequence's rounds, worth 4 judged guesses
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # block sizes the target's cost is measured at
DRAFT_ROWS = (1, 2, 4, 8)
CONTEXT = 128  # positions in the cache while measuring


def curve(points: dict[int, float]) -> Callable[[int], float]:
    """Seconds of a forward over n rows from measured points: linear between them, beyond the
    last along the last two."""
    xs = np.array(sorted(points), dtype=float)
    ys = np.array([points[int(x)] for x in xs])

    def cost(n: int) -> float:
        if n <= xs[-1] or len(xs) < 2:
            return float(np.interp(n, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (n - xs[-1]))

    return cost


@dataclass
class Planner:
    """A batch's plan (decode.batch.Plan) from the target's cost over n rows (`verify`) and a
    draft step's over n rows (`draft`; None: a model-free proposer, guesses cost nothing)."""

    verify: Callable[[int], float]
    draft: Callable[[int], float] | None
    catch_up: Callable[[int], float] | None = None  # the draft over a block of n rows of one sequence

    def __call__(self, running: Sequence[Decoding], most: Sequence[int]) -> list[int]:
        alphas = [acceptance(d) for d in running]
        behind = [self._behind(d) for d in running]
        ks = [0] * len(running)
        best = self.rate(ks, alphas, behind)
        while True:
            tries = [(self.rate(ks[:i] + [k] + ks[i + 1 :], alphas, behind), i, k)
                     for i in range(len(ks)) for k in range(ks[i] + 1, most[i] + 1)]
            if not tries:
                return ks
            rate, i, k = max(tries)
            if rate <= best:
                return ks
            ks[i], best = k, rate

    def rate(self, ks: Sequence[int], alphas: Sequence[float], behind: Sequence[float] | None = None) -> float:
        """Expected tokens per second of a round in which sequence s guesses ks[s]; behind[s]:
        the seconds of its draft's catch-up per token it has left (0: none to pay)."""
        gains = [sum(a**j for j in range(k + 1)) for k, a in zip(ks, alphas)]
        seconds = self.verify(sum(k + 1 for k in ks))
        if self.draft is not None:
            seconds += sum(self.draft(sum(1 for k in ks if k >= j)) for j in range(1, max(ks) + 1))
            # the catch-up spread over the sequence's rounds left (its tokens left / gain a round)
            seconds += sum(b * g for k, b, g in zip(ks, behind or [0.0] * len(ks), gains) if k)
        return sum(gains) / seconds

    def _behind(self, d: Decoding) -> float:
        lag = _lag(d)
        if lag <= 1 or self.catch_up is None:  # one token behind is a draft step's usual first row
            return 0.0
        left = max(1, d.options.max_new_tokens - d.new)
        return self.catch_up(lag) / left


def acceptance(d: Decoding) -> float:
    """The sequence's acceptance per judged guess, with the prior's weight added."""
    s = d.stats
    return (sum(s.position_accepted) + PRIOR * PRIOR_WEIGHT) / (sum(s.position_judged) + PRIOR_WEIGHT)


def _lag(d) -> int:
    """Committed tokens, but the pending one, that the sequence's draft has not read."""
    draft = getattr(d, "draft_lm", None)
    return 0 if draft is None else d.length - 1 - draft.length


def measured_plan(target, drafter) -> Planner:
    """A Planner from forwards timed here: the target over ROWS rows and the draft (if the
    proposer has one) over DRAFT_ROWS lanes and over a block of ROWS rows (its catch-up), after
    CONTEXT positions, the least of 5 each (interference only adds time; a median of 3 read
    1 row at 38 ms and then 26 ms on one quiet Zen 4)."""
    verify = curve(_timed(target, ROWS, last_only=False))
    draft_lm = getattr(drafter, "draft_lm", None)
    if draft_lm is None:
        return Planner(verify, None)
    return Planner(verify, curve(_timed(draft_lm, DRAFT_ROWS, last_only=True)),
                   curve(_timed(draft_lm, ROWS, last_only=False)))


@torch.inference_mode()
def _timed(lm, rows: Sequence[int], last_only: bool) -> dict[int, float]:
    """Seconds of a forward over n rows (the least of 5): n lanes of one row each with
    `last_only` (a draft step carries one row per sequence), else one block of n rows (a
    batch's blocks cost what one block of their rows costs: the weights are read once)."""
    from .batch import forward_blocks

    lanes = [lm.lane(CONTEXT + 64) for _ in range(max(rows) if last_only else 1)]
    context = torch.arange(1, CONTEXT + 1) % lm.vocab_size
    for lane in lanes:
        lane.prefill(context)
    forward_blocks([(lanes[0], context[:1], last_only)])  # one-time costs (kernel choice) before timing
    lanes[0].trim(CONTEXT)
    out = {}
    for n in rows:
        blocks = ([(lane, context[:1], True) for lane in lanes[:n]] if last_only
                  else [(lanes[0], context[:n], False)])
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            forward_blocks(blocks)
            seconds.append(time.perf_counter() - start)
            for lane, _, _ in blocks:
                lane.trim(CONTEXT)
        out[n] = min(seconds)
    for lane in lanes:
        lane.release()
    return out
