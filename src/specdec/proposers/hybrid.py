"""Prompt lookup where the text repeats itself, the draft model everywhere else."""

from __future__ import annotations

import torch

from ..decode.proposal import Drafting, Proposal, drive
from ..decode.sampling import SamplingConfig
from .draft import DraftModel, OverDraft
from .lookup import PromptLookup


class Hybrid(OverDraft):
    """Each round, guesses from an n-gram match if there is one (free: no model call), else
    from the draft model. The draft's cache may fall behind during lookup rounds; its next
    proposal feeds the tokens it missed in one block. Lossless like either part: the engine
    verifies whichever proposal comes, with the distribution it was drawn from."""

    may_lag = True  # its draft is not called in lookup rounds

    def __init__(self, draft: DraftModel, lookup: PromptLookup):
        self.draft, self.lookup = draft, lookup
        self.k = draft.k
        self._drafted = False  # whether the draft made the last proposal
        # Rounds of the last generation the draft proposed: advise prices a hybrid round from
        # this share of draft rounds (the others cost no draft step).
        self.draft_rounds = 0

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        self.draft_rounds = 0
        self.draft.begin(prompt, vocab_size, reuse)
        self.lookup.begin(prompt, vocab_size, reuse)

    def fork(self, slots: int = 256) -> Hybrid:
        return Hybrid(self.draft.fork(slots), self.lookup)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        return drive(self.drafting(seq, k, cfg, generator), self.draft.lm)

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        found = self.lookup.propose(seq, k, cfg, generator)
        self._drafted = not found.tokens.numel()
        self.draft_rounds += self._drafted
        if self._drafted:
            return (yield from self.draft.drafting(seq, k, cfg, generator))
        return found

    def observe(self, proposed: int, accepted: int) -> None:
        if self._drafted:  # the draft's policy learns from its own rounds only
            self.draft.observe(proposed, accepted)

