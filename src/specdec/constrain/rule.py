"""A grammar's mask as a per-row logits rule (decode.rules): row j of a call keeps the logits of
the tokens the grammar allows after that row's own prefix (the prompt's output so far and any
guesses before it) and sets every other column to -inf; once the grammar is complete only the
model's end ids are left.

One matcher serves every query of a generation, whichever order they come in (the draft's steps
over its guesses, the target's block rows, the next round after a rejection, a tree's paths): it
stays at the longest output prefix it has accepted, rolls back to where a query diverges and
consumes the query's remaining tokens. A query whose prefix holds a token the grammar forbids
leaves its row unchanged: the contract says such a row is never used (it follows a guess that
the masked rows before it cannot have chosen).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SpecdecError
from .grammars import Grammar
from .vocab import vocab_of


class GrammarRule:
    """The mask of `grammar` for the output after a prompt of `prompt_length` tokens."""

    def __init__(self, grammar: Grammar, vocab, prompt_length: int):
        import llguidance

        self.matcher = llguidance.LLMatcher(vocab, grammar.text)
        if self.matcher.is_error():
            raise SpecdecError(f"{grammar.what} is not usable: {self.matcher.get_error()}")
        self.what, self.prompt_length = grammar.what, prompt_length
        self.width = vocab.vocab_size
        self.consumed: list[int] = []  # output tokens the matcher stands after
        self._bits = torch.empty((self.width + 31) // 32, dtype=torch.int32)

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
        start = first - self.prompt_length
        if start < 0:
            raise SpecdecError(f"{self.what}: a row before the output ({first} < {self.prompt_length} prompt tokens) "
                               "picks no token and takes no grammar mask")
        output = tokens[self.prompt_length : first + logits.shape[0] - 1].tolist()
        for j in range(logits.shape[0]):
            if self._reach(output, start + j):
                self._mask(logits[j])
        return logits

    def _reach(self, output: list[int], n: int) -> bool:
        """Move the matcher to stand after output[:n]; False where the grammar refuses a token of it."""
        common = _common_prefix(self.consumed, output, min(n, len(self.consumed)))
        if common < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - common)
            del self.consumed[common:]
        rest = output[common:n]
        taken = self.matcher.try_consume_tokens(rest) if rest else 0
        self.consumed += rest[:taken]
        return taken == len(rest)

    def _mask(self, row: torch.Tensor) -> None:
        """-inf in every column the grammar forbids now (and every column past its vocabulary)."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
        width = min(row.numel(), self.width)
        banned = np.unpackbits(np.invert(self._bits.numpy().view(np.uint8)), count=width, bitorder="little")
        row[:width].masked_fill_(torch.from_numpy(banned.view(bool)), float("-inf"))
        row[width:] = float("-inf")


def _common_prefix(a: list[int], b: list[int], n: int) -> int:
    """The length of the common prefix of a[:n] and b[:n], by slices (C-speed compares; a
    divergence, a rejected guess, sits near the end)."""
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def grammar_rule(grammar: Grammar, tokenizer, width: int, end_ids: Sequence[int], prompt_length: int) -> GrammarRule:
    """The rule of `grammar` for one generation: `tokenizer` (fast, Hugging Face) of a model
    scoring `width` logits columns and ending at `end_ids`, after a prompt of `prompt_length`."""
    return GrammarRule(grammar, vocab_of(tokenizer, width, end_ids), prompt_length)
