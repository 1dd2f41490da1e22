"""How many tokens each running sequence guesses in a round of a batch (decode.batch.Plan): the
cost model's rate, tokens committed per second, over the whole batch's round.

A round of the batch costs one target forward over every sequence's block (k_s + 1 rows each,
C_V(sum)) plus the draft steps: step j forwards one row for each sequence that guesses at least
j tokens (C_D(rows)). Sequence s commits E_s(k) = 1 + a_s + ... + a_s^k tokens in expectation,
with a_s its own acceptance per judged guess so far (a prior until its rounds say more). The plan
starts from the best k shared by all sequences, then moves one sequence's k up or down, or
every sequence up to a level, by whatever move gives the best rate of the batch, while that
rate grows; so plain rows (k = 0) where guessing does not pay for the rows it adds, guesses
where it does by a margin over all-plain (MARGIN). A sequence whose draft has fallen behind
(plain rounds, or only the prompt's first token read: decode.batch) first pays the draft's
catch-up block, a one-time cost the plan spreads over the rounds the sequence has left. The
costs are measured on the models at hand (measured_plan: a second or two at a server's start),
never assumed, and re-timed from the batch's own forwards while it runs (Planner.observe): a
start on a noisy VM read the same 16-row forward 20-40% apart, and the contexts served are
longer than the one timed.

The plan depends only on earlier rounds and on measured costs, never on the target's
distribution of the round it plans, so sampling stays exact (as adaptive k's policies).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .interface import Runtime
from .sequence import Decoding

Riding = Callable[[int], int]  # the prompt rows a round carries beside n decode rows

PRIOR, PRIOR_WEIGHT = 0.6, 4.0  # acceptance assumed before a sequence's rounds, worth 4 judged guesses
PASSES = 5  # readings of each point (measured_plan keeps the least)
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # block sizes the target's cost is measured at
DRAFT_ROWS = (1, 2, 4, 8)
CONTEXT = 128  # positions in the cache while measuring
# Rows of a prompt forwarded on its own, to price a prompt row riding in a round: per row, any
# block past ~64 rows costs about the same on these CPUs (compute-bound), so the choice is loose.
PROMPT_BLOCK = 256
RECENT, LEAST_READINGS = 16, 4  # forwards re-timed per block size; readings before they count
# What guessing must promise over plain rows before the plan takes it. The rates are predicted
# from costs a noisy VM reads 10-30% apart from one spell to the next, and a plan's guesses pay
# beyond its rounds (the draft's catch-up, longer rounds for everyone): on the Zen 4 at 4
# clients, plans the rates put 5-9% ahead of plain ran 9% behind it.
MARGIN = 0.10


def curve(points: dict[int, float]) -> Callable[[int], float]:
    """Seconds of a forward over n rows from measured points: linear between them, beyond the
    last along the last two. A point above a later one is lowered to it: more rows never cost
    less, and interference only adds time, so the higher reading is the noisy one."""
    xs = np.array(sorted(points), dtype=float)
    ys = np.minimum.accumulate(np.array([points[int(x)] for x in xs])[::-1])[::-1]

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
    measured: dict[str, dict[int, float]] | None = None  # measured_plan's points: seconds by rows
    margin: float = MARGIN

    def __post_init__(self):
        self._given = {"verify": self.verify, "draft": self.draft}
        # observe's readings over what the given costs say, the RECENT last by (cost, rows), and
        # their medians by rows for each cost
        self.recent: dict[tuple[str, int], deque] = {}
        self._ratios: dict[str, dict[int, float]] = {name: {} for name in self._given}

    def __str__(self) -> str:
        if not self.measured:
            return "a plan from given costs"
        return "; ".join(f"{name.replace('_', '-')} over " + "/".join(map(str, points)) + " rows "
                         + "/".join(f"{1000 * s:.0f}" for s in points.values()) + " ms"
                         for name, points in self.measured.items())

    def observe(self, name: str, rows: int, seconds: float) -> None:
        """A forward the batch ran, timed: the target over `rows` rows (name "verify") or a draft
        step over `rows` lanes ("draft"). From LEAST_READINGS readings at a size on, the cost at
        every size is the given one times the median ratio of the RECENT readings at the nearest
        sizes read (interpolated between them): the sizes served are what the plan chooses
        between, and they carry the contexts served."""
        given = self._given.get(name)
        if given is None or rows < 1:
            return
        recent = self.recent.setdefault((name, rows), deque(maxlen=RECENT))
        recent.append(seconds / given(rows))
        if len(recent) >= LEAST_READINGS:
            self._ratios[name][rows] = float(np.median(recent))
            setattr(self, name, _scaled(given, self._ratios[name]))

    def retimed(self) -> str:
        """What observe has changed, for a log: each cost's ratio to its start by rows read."""
        parts = [f"{name} over " + ", ".join(f"{n} rows x{ratio:.2f}" for n, ratio in sorted(ratios.items()))
                 for name, ratios in self._ratios.items() if ratios]
        return "; ".join(parts) or "nothing re-timed"

    def __call__(self, running: Sequence[Decoding], most: Sequence[int], riding: Riding | None = None) -> list[int]:
        """Each running sequence's k (at most most[i]); `riding`: the prompt rows of joining
        sequences that a round with n decode rows carries (None: nobody joins). A sequence alone
        guesses as its proposer says, unless its draft fell behind in plain rounds: whether the
        catch-up pays for the tokens it has left is the plan's to say. (A draft that lags only
        where its proposer did not need it, never in a plain round, is not behind that way: the
        prompt's rest before its first guess, a hybrid's memory or lookup rounds. Alone, the
        sequence guesses as a request decoded by itself does. Judged as behind, a hybrid whose
        memory took the first round was kept plain to its end: its draft never caught up, and
        the memory was no longer asked.) A draft never catches
        up in a round that carries a prompt: that round is long already (its prompt rows are
        compute-bound), and the catch-up would add its own time to every stream's wait."""
        alphas = [acceptance(d) for d in running]
        behind = [self._behind(d) for d in running]
        if len(running) == 1 and riding is None and (not behind[0] or not running[0].stats.rounds_without_proposal):
            return list(most)
        if riding is not None:
            most = [0 if _lag(d) > 1 else m for d, m in zip(running, most)]

        def rate(ks: tuple[int, ...]) -> float:
            return self.rate(ks, alphas, behind, riding)

        ks = max((_level((0,) * len(most), most, level) for level in range(max(most) + 1)), key=rate)
        best = rate(ks)
        while True:
            got, t = max(((rate(t), t) for t in _moves(ks, most)), key=lambda x: x[0], default=(best, ks))
            if got <= best:
                break
            ks, best = t, got
        plain = (0,) * len(most)
        return list(ks if best >= (1 + self.margin) * rate(plain) else plain)

    def rate(self, ks: Sequence[int], alphas: Sequence[float], behind: Sequence[float] | None = None,
             riding: Riding | None = None) -> float:
        """Expected tokens per second of a round in which sequence s guesses ks[s]; behind[s]:
        the seconds of its draft's catch-up per token it has left (0: none to pay). Prompt rows
        riding in the round are charged what a row costs in a prompt forwarded on its own: the
        decode rows pay the rest, little more than their own compute where the prompt fills the
        round, and a guess row, which takes a prompt row's place, pays for the row it pushes
        to a later round."""
        gains = [sum(a**j for j in range(k + 1)) for k, a in zip(ks, alphas)]
        rows = sum(k + 1 for k in ks)
        prompt = riding(rows) if riding is not None else 0
        seconds = self.verify(rows + prompt) - prompt * self.verify(PROMPT_BLOCK) / PROMPT_BLOCK
        if self.draft is not None:
            seconds += sum(self.draft(sum(1 for k in ks if k >= j)) for j in range(1, max(ks) + 1))
            # the catch-up spread over the sequence's rounds left (its tokens left / gain a round)
            seconds += sum(b * g for k, b, g in zip(ks, behind or [0.0] * len(ks), gains) if k)
        return sum(gains) / max(seconds, 1e-9)

    def _behind(self, d: Decoding) -> float:
        lag = _lag(d)
        if lag <= 1 or self.catch_up is None:  # one token behind is a draft step's usual first row
            return 0.0
        left = max(1, d.options.max_new_tokens - d.new)
        return self.catch_up(lag) / left


def _scaled(given: Callable[[int], float], ratios: dict[int, float]) -> Callable[[int], float]:
    """`given` times the ratio read at n, interpolated between the sizes read (beyond them: the
    nearest one's), and never above what a larger size read costs (as curve's points: more rows
    never cost less). Without that floor a size read in a slow spell stays dear: on the Zen 4
    4-row readings at x2.07 against 6 rows' x1.15 priced plain rounds of 4 sequences above
    guessing rounds of 7 rows, the plan then never chose 4 rows again to re-time them, and
    speculation ran at 0.88x plain's tokens in all (scripts/measure/batch_arrivals.py)."""
    xs = np.array(sorted(ratios), dtype=float)
    ys = np.array([ratios[int(x)] for x in xs])
    known: dict[int, float] = {}  # a plan asks the same few sizes many times a round

    def scaled(n: int) -> float:
        return given(n) * float(np.interp(n, xs, ys))

    def cost(n: int) -> float:
        if n not in known:
            known[n] = min([scaled(n)] + [scaled(int(m)) for m in xs if m > n])
        return known[n]

    return cost


def _level(ks: tuple[int, ...], most: Sequence[int], level: int) -> tuple[int, ...]:
    """Every sequence raised to guess at least `level` tokens (within its most)."""
    return tuple(max(k, min(level, m)) for k, m in zip(ks, most))


def _moves(ks: tuple[int, ...], most: Sequence[int]) -> list[tuple[int, ...]]:
    """The plans one move from ks: one sequence's k raised (by any step) or lowered by one, or
    every sequence raised to a level. The last matters because a draft step costs about the
    same over 1 lane as over 8: one sequence's first guess rarely pays for the step alone, a
    guess from each of them does (4 sequences at 75% acceptance on the AMX Xeon: one k=1 lost,
    k=1 for all four gained 22%)."""
    moves = {ks[:i] + (k,) + ks[i + 1 :] for i in range(len(ks)) for k in range(ks[i] + 1, most[i] + 1)}
    moves |= {ks[:i] + (ks[i] - 1,) + ks[i + 1 :] for i in range(len(ks)) if ks[i]}
    moves |= {_level(ks, most, level) for level in range(1, max(most) + 1)}
    moves.discard(ks)
    return sorted(moves)


def acceptance(d: Decoding) -> float:
    """The sequence's acceptance per judged guess, with the prior's weight added."""
    s = d.stats
    return (sum(s.position_accepted) + PRIOR * PRIOR_WEIGHT) / (sum(s.position_judged) + PRIOR_WEIGHT)


def _lag(d: Decoding) -> int:
    """Committed tokens, but the pending one, that the sequence's draft has not read."""
    draft = d.draft_lm
    return 0 if draft is None else d.length - 1 - draft.length


def measured_plan(target, drafter) -> Planner:
    """A Planner from forwards timed here: the target over ROWS rows and the draft (if the
    proposer has one) over DRAFT_ROWS lanes and over a block of ROWS rows (its catch-up), after
    CONTEXT positions (_timed)."""
    draft_lm = drafter.draft_lm if drafter is not None else None
    probes = {"verify": (target, ROWS, False)}
    if draft_lm is not None:
        probes |= {"draft": (draft_lm, DRAFT_ROWS, True), "catch_up": (draft_lm, ROWS, False)}
    measured = _timed(probes)
    costs = {name: curve(points) for name, points in measured.items()}
    return Planner(costs["verify"], costs.get("draft"), costs.get("catch_up"), measured)


@torch.inference_mode()
def _timed(probes: dict[str, tuple[Runtime, Sequence[int], bool]]) -> dict[str, dict[int, float]]:
    """Seconds of a forward over n rows for each probe (lm, rows, last_only): n lanes of one row
    each with `last_only` (a draft step carries one row per sequence), else one block of n rows
    (a batch's blocks cost what one block of their rows costs: the weights are read once).
    After a pass that warms up (the first forwards after a load ran 20-50% slower on the AMX
    Xeon), PASSES passes each time every probe at every n once; a point is its least reading:
    interference only adds time, and a burst of it then lifts one pass's readings instead of
    every reading of the points timed during it (on a noisy VM, timing each point's repeats
    back to back moved the plan's 16-row cost by 20-40% between starts)."""
    from .batch import forward_blocks

    timed, lanes = [], []
    try:
        for name, (lm, rows, last_only) in probes.items():
            own = [lm.lane(CONTEXT + 64) for _ in range(max(rows) if last_only else 1)]
            lanes += own
            context = torch.arange(1, CONTEXT + 1) % lm.vocab_size
            for lane in own:
                lane.prefill(context)
            timed += [(name, n, [(lane, context[:1], True) for lane in own[:n]] if last_only
                       else [(own[0], context[:n], False)]) for n in rows]
        readings: dict[tuple[str, int], list[float]] = {(name, n): [] for name, n, _ in timed}
        for at in range(PASSES + 1):
            for name, n, blocks in timed:
                start = time.perf_counter()
                forward_blocks(blocks)
                if at:  # the first pass warms up
                    readings[name, n].append(time.perf_counter() - start)
                for lane, _, _ in blocks:
                    lane.trim(CONTEXT)
    finally:
        for lane in lanes:
            lane.release()
    least: dict[str, dict[int, float]] = {name: {} for name in probes}
    for (name, n), seconds in readings.items():
        least[name][n] = min(seconds)
    return least
