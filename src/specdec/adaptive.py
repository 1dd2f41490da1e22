"""Adaptive k by the cost model: a round stops guessing when one more guess is not expected
to pay for itself.

After i guesses whose draft probabilities are c_1..c_i, take c_j as the chance that guess j is
accepted once its predecessors were. The round would commit E_i = 1 + sum_j c_1...c_j tokens
for T_i = i*C_D + C_V(i) seconds. One more guess adds about c_1...c_i * c_i tokens (it counts
only if all earlier guesses pass, and is taken as likely as the last one) and costs
C_D + C_V(i+1) - C_V(i). Guess again only if that ratio beats the round's rate E_i / T_i.

On a CPU where C_V jumps at some block sizes (docs/advise.md: 1.1 target steps for 1-2 rows,
2.0 for 3-5) this stops at the jump unless the draft is very sure, and goes on cheaply inside a
flat stretch. The decision reads the draft's probabilities only, so sampling stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .costmodel import Costs
from .errors import SpecdecError


@dataclass(frozen=True)
class PayRule:
    c_draft: float  # seconds per draft forward of one token
    c_verify: tuple[float, ...]  # C_V(0..k_max) in seconds; C_V(0) is one target step
    # Built from an advise report by specdec.advice.Advice.pay_rule.

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
