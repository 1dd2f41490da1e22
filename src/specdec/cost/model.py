"""Cost model of speculative decoding: when does guessing ahead pay?

One round: the proposer guesses k tokens (k * C_D, or ~0 for n-gram lookup), the
target scores them in one forward (C_V(k); C_V(0) = C_T(1), a plain decode step),
the accepted prefix A (0..k) plus one target token is committed, so a round yields
A + 1 tokens. C_O is the per-round overhead (acceptance, commit, the cache trims after a
rejection: measured, they are a small part of it). Hence

    cost per token = (k*C_D + C_V(k) + C_O) / E[A + 1]
    speedup        = (C_T(1) + baseline overhead) / cost per token

The same formula prices a round whose length is not fixed (a tree, a confidence floor, the
pay rule, a schedule) from what its rounds did as measured (Rounds): mean draft steps x C_D,
plus C_V of each block size weighted by its share of rounds, plus C_O, over the mean tokens a
round committed.

Pure math (numpy/scipy, no torch) so the benchmark and the advisor can predict from
measured numbers without loading a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


def expected_accepted_iid(alpha: float, k: int) -> float:
    """E[A] when each position is accepted independently with probability alpha.

    Equals alpha*(1-alpha^k)/(1-alpha) (k at alpha=1, 0 at alpha=0). Summed term by
    term because the closed form cancels catastrophically near alpha=1, which the
    root finders below visit.
    """
    return float(sum(alpha**i for i in range(1, k + 1)))


def expected_tokens_iid(alpha: float, k: int) -> float:
    """Tokens per round, E[A]+1 = (1-alpha^(k+1))/(1-alpha) (Leviathan et al., 2023)."""
    return expected_accepted_iid(alpha, k) + 1.0


@dataclass(frozen=True)
class Acceptance:
    """Per-position conditional acceptance rates r_1..r_k of one proposer on one workload.

    r_i = P(position i accepted | positions 1..i-1 accepted), measured as
    accepted_at_i / reached_i. Conditional rates, unlike one alpha, capture that
    later guesses are usually worse; the i.i.d. model is the special case r_i = alpha.

    hit_rate is the share of rounds in which the proposer guesses at all: prompt
    lookup proposes nothing when no n-gram matches, and such a round is a plain
    decode step (C_V(0)) that commits one token. A draft model always guesses (1.0).
    """

    rates: tuple[float, ...]
    hit_rate: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        if not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"acceptance rates must lie in [0, 1], got {self.rates}")
        if not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate must lie in [0, 1], got {self.hit_rate}")

    @classmethod
    def from_rates(cls, rates: Sequence[float]) -> Acceptance:
        return cls(tuple(rates))

    @classmethod
    def from_alpha(cls, alpha: float, k: int) -> Acceptance:
        """The i.i.d. model: every position accepted with probability alpha."""
        return cls((alpha,) * k)

    @classmethod
    def from_histogram(cls, counts: Sequence[float]) -> Acceptance:
        """From counts of rounds by accepted length, counts[a] for A = 0..k.

        Position i is reached by rounds with A >= i-1 and accepted by those with
        A >= i. A position no round reached gets rate 0; it cannot change E[A]
        because the probability of reaching it is already 0.
        """
        c = np.asarray(counts, dtype=float)
        if c.ndim != 1 or c.size == 0 or np.any(c < 0) or c.sum() <= 0:
            raise ValueError(f"histogram needs non-negative counts with a positive total, got {counts}")
        at_least = np.cumsum(c[::-1])[::-1]  # at_least[a] = rounds with A >= a
        reached, accepted = at_least[:-1], at_least[1:]
        rates = np.divide(accepted, reached, out=np.zeros_like(accepted), where=reached > 0)
        return cls(tuple(rates))

    @property
    def k(self) -> int:
        return len(self.rates)

    @property
    def accepted_when_guessing(self) -> float:
        """E[A | the proposer guessed] = sum_i prod_{j<=i} r_j: position i counts iff
        positions 1..i all pass."""
        return float(np.sum(np.cumprod(self.rates))) if self.rates else 0.0

    @property
    def expected_accepted(self) -> float:
        """E[A] over all rounds, guessing or not."""
        return self.hit_rate * self.accepted_when_guessing

    @property
    def expected_tokens(self) -> float:
        """Tokens committed per round, E[A] + 1 (the target always adds one)."""
        return self.expected_accepted + 1.0

    def at_k(self, k: int) -> Acceptance:
        """The rates to assume when proposing k tokens instead of the measured self.k.

        For k <= self.k the first k measured rates are used (a shorter guess sees the
        same first positions). For k > self.k the model has no data and must guess:
        it repeats the last measured rate (later positions rarely do better, so this
        tends to be optimistic).
        """
        if k <= self.k:
            return Acceptance(self.rates[:k], self.hit_rate)
        if not self.rates:
            raise ValueError("cannot extrapolate acceptance measured at k=0")
        return Acceptance(self.rates + (self.rates[-1],) * (k - self.k), self.hit_rate)


def fit_alpha(acceptance: Acceptance) -> float:
    """The i.i.d. alpha whose E[A] at the same k equals the measured E[A].

    Lets a report show the textbook formula next to the per-position model; build
    the argument with Acceptance.from_rates or Acceptance.from_histogram.
    """
    k, target = acceptance.k, acceptance.accepted_when_guessing
    if k == 0:
        raise ValueError("alpha is undefined for acceptance measured at k=0")
    if target <= 0.0:
        return 0.0
    if target >= k:
        return 1.0
    from scipy.optimize import brentq  # scipy costs a second at import; generate never needs it

    return float(brentq(lambda a: expected_accepted_iid(a, k) - target, 0.0, 1.0, xtol=1e-15))


@dataclass(frozen=True)
class Costs:
    """Measured timings in seconds.

    c_verify is either a callable k -> C_V(k) or measured points {k: seconds}; the
    points are completed with C_V(0) = c_target (scoring the one committed token is a
    plain decode step), interpolated linearly between measured k and extrapolated
    linearly from the last two points (never downwards), because verify cost grows close to linearly
    in block size until the GPU saturates. c_baseline_overhead is the per-token
    python/sampling overhead of plain decoding, so both sides are compared alike.
    """

    c_target: float
    c_draft: float
    c_verify: Mapping[int, float] | Callable[[int], float]
    c_overhead: float = 0.0
    c_baseline_overhead: float = 0.0
    _points: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.c_target > 0:
            raise ValueError(f"c_target must be positive, got {self.c_target}")
        scalars = (self.c_draft, self.c_overhead, self.c_baseline_overhead)
        if any(not c >= 0 for c in scalars):
            raise ValueError(f"costs must be non-negative, got {scalars}")
        if callable(self.c_verify):
            return
        points = {0: self.c_target, **{int(k): float(v) for k, v in self.c_verify.items()}}
        if len(points) < 2 or min(points) < 0:
            raise ValueError(f"c_verify needs at least one measured k >= 1, got {dict(self.c_verify)}")
        ks = np.array(sorted(points), dtype=float)
        object.__setattr__(self, "_points", (ks, np.array([points[int(k)] for k in ks])))

    def verify(self, k: int) -> float:
        """C_V(k): one target forward scoring k proposed tokens."""
        if self._points is None:
            return float(self.c_verify(k))  # type: ignore[operator]
        ks, ts = self._points
        if k <= ks[-1]:
            return float(np.interp(k, ks, ts))
        # A longer block never costs less: noisy last points must not extrapolate downwards.
        slope = max(0.0, (ts[-1] - ts[-2]) / (ks[-1] - ks[-2]))
        return float(ts[-1] + slope * (k - ks[-1]))


@dataclass(frozen=True)
class Rounds:
    """What a method's rounds do on average: the draft steps they take (C_D each), the blocks
    the target verifies, the tokens they commit.

    blocks[n] is the share of rounds that verify n proposed tokens after the pending one, in
    one forward (a tree's n counts all its nodes; n = 0 is a plain step, C_V(0) = C_T(1)). The
    fixed-k model's rounds follow from acceptance (Rounds.fixed); a method whose round length
    varies is measured (specdec.tune.calibration)."""

    draft_steps: float
    blocks: Mapping[int, float]
    tokens: float

    @classmethod
    def fixed(cls, acceptance: Acceptance, k: int) -> Rounds:
        """Proposing k tokens a round with these rates (acceptance.at_k(k)): k draft steps every
        round, a block of k where the proposer guessed and only the pending token elsewhere."""
        acc = acceptance.at_k(k)
        return cls(k, {k: acc.hit_rate, 0: 1.0 - acc.hit_rate}, acc.expected_tokens)

    @property
    def nodes(self) -> float:
        """Tokens verified per round after the pending one."""
        return float(sum(n * share for n, share in self.blocks.items()))


def round_cost(costs: Costs, rounds: Rounds) -> float:
    """Expected seconds of one round: draft_steps*C_D + sum over n of share_n*C_V(n) + C_O."""
    verify = sum(share * costs.verify(n) for n, share in rounds.blocks.items() if share)
    return rounds.draft_steps * costs.c_draft + verify + costs.c_overhead


def seconds_per_token(costs: Costs, rounds: Rounds) -> float:
    """Expected seconds per committed token of these rounds."""
    return round_cost(costs, rounds) / rounds.tokens


def rounds_speedup(costs: Costs, rounds: Rounds) -> float:
    """Plain decoding's seconds per token over these rounds'; > 1 means they pay."""
    return (costs.c_target + costs.c_baseline_overhead) / seconds_per_token(costs, rounds)


def cost_per_token(costs: Costs, acceptance: Acceptance, k: int) -> float:
    """Expected seconds per committed token when proposing k (acceptance.at_k(k) rates)."""
    return seconds_per_token(costs, Rounds.fixed(acceptance, k))


def predicted_speedup(costs: Costs, acceptance: Acceptance, k: int) -> float:
    """Plain decoding's seconds per token over speculative decoding's; > 1 means it pays."""
    return rounds_speedup(costs, Rounds.fixed(acceptance, k))


def break_even_alpha(costs: Costs, k: int) -> float | None:
    """The i.i.d. alpha at which speculating with k tokens exactly matches plain decoding.

    Speedup rises with alpha (more tokens per round), so the root is
    unique. 0.0 if even alpha=0 pays: a round then still commits the target's token,
    so this happens only when the whole round costs less than a plain step (free
    proposer and a cheap verify). None if even alpha=1 does not pay.
    """
    if k < 1:
        raise ValueError(f"break-even needs k >= 1, got {k}")

    def excess(alpha: float) -> float:
        return predicted_speedup(costs, Acceptance.from_alpha(alpha, k), k) - 1.0

    if excess(0.0) >= 0.0:
        return 0.0
    top = excess(1.0)
    if top < 0.0:
        return None
    if top == 0.0:
        return 1.0
    from scipy.optimize import brentq

    return float(brentq(excess, 0.0, 1.0, xtol=1e-15))


def optimal_k(costs: Costs, acceptance: Acceptance, k_max: int = 16) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted speedup, and that speedup.

    Returns (0, 1.0), i.e. "don't speculate", when no k beats plain decoding. Ties go
    to the smaller k (less wasted draft work for the same prediction). Rates beyond
    the measured k are extended as in Acceptance.at_k (last measured rate).
    """
    best_k, best = 0, 1.0
    for k in range(1, k_max + 1):
        s = predicted_speedup(costs, acceptance, k)
        if s > best:
            best_k, best = k, s
    return best_k, best


def prediction_error(predicted: float, measured: float) -> float:
    """Relative error of a prediction: predicted/measured - 1 (+0.1 = 10% above the measurement)."""
    return predicted / measured - 1.0
