"""Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens."""

from __future__ import annotations

import torch

from ..decode.proposal import Drafting, Proposal, settled
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError


class ModelFree:
    """What a proposer that runs no model does between its guesses: nothing. Deterministic
    guesses, so q is a point mass on each, and no draft forward (drafting is settled at once)."""

    calls = 0
    draft_lm = None
    may_lag = False

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        pass

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        """propose's guesses as a conversation that needs no draft forward."""
        return settled(self.propose(seq, k, cfg, generator))

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def rollback(self, committed_len: int) -> None:
        pass

    def finish(self, tokens: torch.Tensor) -> None:
        pass


class PromptLookup(ModelFree):
    """N-gram match in the prompt and the text so far; proposes nothing when nothing matches."""

    def __init__(self, k: int = 8, max_ngram: int = 3):
        if k < 1:
            raise SpecdecError(f"k must be >= 1, got {k}")
        if max_ngram < 1:
            raise SpecdecError(f"max_ngram must be >= 1, got {max_ngram}")
        self.k, self.max_ngram = k, max_ngram

    def fork(self, slots: int = 256) -> PromptLookup:
        return self  # nothing of a sequence is kept between rounds

    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        for n in range(min(self.max_ngram, seq.numel() - 1), 0, -1):
            continuation = self._continuation(seq, n, k)
            if continuation.numel():
                return Proposal(continuation)
        return Proposal(seq[:0])

    @staticmethod
    def _continuation(seq: torch.Tensor, n: int, k: int) -> torch.Tensor:
        # Windows of seq[:-1] start before the final n-gram, so the suffix never matches itself.
        windows = seq[:-1].unfold(0, n, 1)
        starts = (windows == seq[-n:]).all(-1).nonzero().flatten() + n
        if not starts.numel():
            return seq[:0]
        # The latest match with a full k-token continuation, else the earliest (longest) one.
        full = starts[starts + k <= seq.numel()]
        start = int(full[-1]) if full.numel() else int(starts[0])
        return seq[start : start + k]
