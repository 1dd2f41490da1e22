"""Rules that change a row of logits from the tokens before it (penalties, logit_bias, a grammar's
mask), applied the same way to every row that predicts a token: the target's prefill row, each
row of a speculative block, and each of the draft's guessing steps.

Why a row's rule reads the tokens before that row, and not the committed sequence: in a block
[pending, g1..gk] row i predicts the token after g1..gi, so a repetition penalty or a grammar
state must count g1..gi as plain decoding would have, had it committed them. Then row i of a
block is transformed exactly as the one-row step at that position would be, and greedy output
with rules equals plain decoding with the same rules bit for bit; sampled output keeps the
transformed target's distribution (the draft's q from its own transformed rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LogitsRule(Protocol):
    """One transform of logits rows. A rule may keep state between calls (a grammar matcher
    advanced to the committed tokens), but its result for a row depends only on the tokens
    before that row, whichever call and block the row comes in."""

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
        """`logits` [n, vocab]: row j predicts the token at position `first + j` of `tokens`,
        which holds the prompt, the committed output and then any guesses (at least
        first + n - 1 tokens). Returns the transformed rows (in place or new); a row that
        follows a token the rule forbids may come back unchanged (it is never used)."""


def apply_rules(rules: Sequence[LogitsRule], logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
    """Every rule in order: logit_bias, then penalties (as llama.cpp's and vLLM's samplers order
    them: decode.penalties), then a grammar's mask."""
    for rule in rules:
        logits = rule.apply(logits, tokens, first)
    return logits
