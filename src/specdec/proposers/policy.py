"""How many tokens a draft guesses in a round: the policies of adaptive k.

A policy sees the round from both sides: before and while guessing (`budget`, and after each
guess `guess_again` with the draft's probabilities of its guesses so far) and after
verification (`observe`: how many of the round's guesses the target accepted). Every decision
depends on the draft's own numbers or on earlier rounds, never on the target's distribution of
the round being judged, so sampling stays exact (a round's length is fixed before the verifier
looks at it).

- ConfidenceFloor (conf=P): stop after a guess whose probability is below P.
- PayRule (pay=1): stop when one more guess is not expected to pay for itself, by the cost
  model. After i guesses whose draft probabilities are c_1..c_i, take c_j as the chance that
  guess j is accepted once its predecessors were. The round would commit E_i = 1 + sum_j
  c_1...c_j tokens for T_i = i*C_D + C_V(i) seconds. One more guess adds about c_1...c_i * c_i
  tokens (it counts only if all earlier guesses pass, and is taken as likely as the last one)
  and costs C_D + C_V(i+1) - C_V(i). Guess again only if that ratio beats the round's rate
  E_i / T_i. On a CPU where C_V jumps at some block sizes (docs/advise.md: 1.1 target steps
  for 1-2 rows, 2.0 for 3-5) this stops at the jump unless the draft is very sure, and goes on
  cheaply inside a flat stretch.
- AcceptanceSchedule (dyn=1): the budget follows what verification accepted, as transformers'
  "heuristic" schedule does: 2 more guesses after a round that accepted all of its guesses, 1
  fewer after one that did not, between 1 and k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..cost.model import Costs
from ..errors import SpecdecError


class Policy:
    """Guess k tokens a round, whatever happens (the neutral policy; others override)."""

    # Whether guess_again reads the draft's probabilities: a host read per guess on CUDA.
    reads_confidence = False

    def begin(self) -> None:
        """A new sequence starts."""

    def budget(self, k: int) -> int:
        """The most guesses this round may make, given the proposer's k."""
        return k

    def guess_again(self, confidences: Sequence[float]) -> bool:
        """After guesses with these draft probabilities, guess one more?"""
        return True

    def observe(self, proposed: int, accepted: int) -> None:
        """Verification accepted `accepted` of the round's `proposed` guesses."""


class ConfidenceFloor(Policy):
    reads_confidence = True

    def __init__(self, floor: float):
        if not 0.0 < floor < 1.0:
            raise SpecdecError(f"a confidence floor must lie strictly between 0 and 1, got {floor}")
        self.floor = floor

    def guess_again(self, confidences: Sequence[float]) -> bool:
        return confidences[-1] >= self.floor


class AcceptanceSchedule(Policy):
    GROW, SHRINK = 2, 1

    def __init__(self, k: int):
        self.k = self.current = k

    def begin(self) -> None:
        self.current = self.k

    def budget(self, k: int) -> int:
        return min(k, self.current)

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:  # a round that asked for no guesses (the last one) says nothing
            return
        step = self.GROW if accepted == proposed else -self.SHRINK
        self.current = max(1, min(self.k, self.current + step))


class AllOf(Policy):
    """Several policies at once: the smallest budget; guess again only if every one would."""

    def __init__(self, policies: Sequence[Policy]):
        self.policies = tuple(policies)
        self.reads_confidence = any(p.reads_confidence for p in self.policies)

    def begin(self) -> None:
        for p in self.policies:
            p.begin()

    def budget(self, k: int) -> int:
        return min(p.budget(k) for p in self.policies)

    def guess_again(self, confidences: Sequence[float]) -> bool:
        return all(p.guess_again(confidences) for p in self.policies)

    def observe(self, proposed: int, accepted: int) -> None:
        for p in self.policies:
            p.observe(proposed, accepted)


def combined(policies: Sequence[Policy]) -> Policy:
    """One policy for these (the neutral one for none)."""
    if not policies:
        return Policy()
    return policies[0] if len(policies) == 1 else AllOf(policies)


@dataclass(frozen=True)
class PayRule(Policy):
    c_draft: float  # seconds per draft forward of one token
    c_verify: tuple[float, ...]  # C_V(0..k_max) in seconds; C_V(0) is one target step
    # Built from an advise report by specdec.tune.advice.Advice.pay_rule.
    reads_confidence = True

    def __post_init__(self) -> None:
        if self.c_draft < 0 or len(self.c_verify) < 2 or min(self.c_verify) <= 0:
            raise SpecdecError(f"a pay rule needs C_D >= 0 and C_V(0), C_V(1), ... > 0, got {self}")

    @classmethod
    def from_costs(cls, costs: Costs, c_draft: float, k_max: int) -> PayRule:
        return cls(c_draft, tuple(costs.verify(k) for k in range(k_max + 1)))

    @property
    def k_max(self) -> int:
        return len(self.c_verify) - 1

    def guess_again(self, confidences: Sequence[float]) -> bool:
        """After guesses with these draft probabilities, is one more expected to pay?"""
        i = len(confidences)
        if i >= self.k_max:
            return False
        reach, tokens = 1.0, 1.0
        for c in confidences:
            reach *= c
            tokens += reach
        seconds = i * self.c_draft + self.c_verify[i]
        gain = reach * confidences[-1] if confidences else 1.0
        extra = self.c_draft + self.c_verify[i + 1] - self.c_verify[i]
        return gain * seconds > tokens * extra
