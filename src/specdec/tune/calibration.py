"""What a proposer did on calibration prompts: acceptance by position, hit rate, time per round,
pooled over generations (specdec advise measures it; specdec sweep summarises its runs with it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cost.model import Acceptance, Rounds, expected_accepted_iid
from ..decode.stats import GenerationStats
from .advice import Calibrated


@dataclass(frozen=True)
class Calibration:
    acceptance: Acceptance
    histogram: list[int]  # rounds by accepted length 0..k, rounds that guessed
    acceptance_rate: float  # accepted / proposed: the naive i.i.d. alpha most tools report
    propose_per_round: float  # seconds
    overhead_per_round: float  # seconds outside propose and verify
    tokens_per_s: float
    draft_share: float = 1.0  # rounds in which the draft model proposed, of all rounds (hybrid)
    rounds: Rounds | None = None  # what its rounds did (None: a record from before version 4)

    @classmethod
    def from_stats(cls, stats: Sequence[GenerationStats], draft_rounds: int | None = None) -> Calibration:
        """Pooled over generations; `draft_rounds`: of their rounds, those the draft proposed
        (a hybrid's count; None: every round, or no draft)."""
        pooled = GenerationStats.pooled(stats)
        rates = pooled.position_acceptance
        # A generation's last round may be left no room to guess (max_new_tokens); that is no miss.
        rounds_of = [_without_empty_last(s) for s in stats]
        proposed = [n for generation in rounds_of for n, _, _ in generation]
        lengths = [a for generation in rounds_of for n, a, _ in generation if n > 0]
        rounds = max(1, pooled.rounds)
        hit = sum(n > 0 for n in proposed) / len(proposed) if proposed else 0.0
        return cls(
            acceptance=Acceptance(tuple(rates), hit),
            acceptance_rate=pooled.acceptance_rate,
            histogram=np.bincount(lengths, minlength=len(rates) + 1).tolist() if lengths else [],
            propose_per_round=pooled.times.get("propose", 0.0) / rounds,
            overhead_per_round=(pooled.times.get("accept", 0.0) + pooled.times.get("other", 0.0)) / rounds,
            tokens_per_s=pooled.tokens_per_s,
            draft_share=1.0 if draft_rounds is None else min(1.0, draft_rounds / rounds),
            rounds=_measured_rounds([r for generation in rounds_of for r in generation]),
        )

    @classmethod
    def from_record(cls, saved: Calibrated, overhead_per_round: float) -> Calibration:
        """A proposer's calibration from another advise run's record (its acceptance, measured
        where the weights are), with this machine's bookkeeping overhead per round."""
        return cls(
            acceptance=Acceptance(saved.rates, saved.hit_rate),
            histogram=list(saved.histogram),
            acceptance_rate=saved.acceptance_rate,
            propose_per_round=saved.propose_per_round,
            overhead_per_round=overhead_per_round,
            tokens_per_s=0.0,
            draft_share=saved.draft_share,
            rounds=saved.rounds,
        )

    def record(self) -> Calibrated:
        return Calibrated(
            rates=self.acceptance.rates, hit_rate=self.acceptance.hit_rate, histogram=tuple(self.histogram),
            acceptance_rate=self.acceptance_rate, propose_per_round=self.propose_per_round,
            tokens_per_s=self.tokens_per_s, expected_tokens_measured=self.acceptance.expected_tokens,
            expected_tokens_iid=self._iid_tokens(), draft_share=self.draft_share, rounds=self.rounds,
        )

    def _iid_tokens(self) -> float | None:
        """E[A]+1 by the textbook i.i.d. formula with alpha = accepted/proposed, the one number
        most tools report; it ignores that later guesses are accepted less often than the first."""
        if not self.acceptance.rates:
            return None
        return self.acceptance.hit_rate * expected_accepted_iid(self.acceptance_rate, self.acceptance.k) + 1.0


def _without_empty_last(stats: GenerationStats) -> list[tuple[int, int, int]]:
    """(proposed, accepted, draft steps) per round, without a final round that proposed nothing."""
    rounds = list(zip(stats.proposed_lengths, stats.accept_lengths, stats.draft_steps))
    return rounds[:-1] if rounds and rounds[-1][0] == 0 else rounds


def _measured_rounds(rounds: list[tuple[int, int, int]]) -> Rounds | None:
    """Their mean draft steps, the share of rounds by tokens verified, their mean tokens
    committed (the cost model prices a round option from these: specdec.cost.model.Rounds)."""
    if not rounds:
        return None
    n = len(rounds)
    sizes = np.bincount([p for p, _, _ in rounds])
    return Rounds(draft_steps=sum(d for _, _, d in rounds) / n,
                  blocks={size: count / n for size, count in enumerate(sizes.tolist()) if count},
                  tokens=sum(a + 1 for _, a, _ in rounds) / n)

