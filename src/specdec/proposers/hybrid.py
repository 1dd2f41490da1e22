"""Prompt lookup where the text repeats itself, the draft model everywhere else."""

from __future__ import annotations

import torch

from ..decode.proposal import Drafting, Proposal, drive
from ..decode.sampling import SamplingConfig
from .draft import DraftModel, OverDraft
from .lookup import PromptLookup


class EitherOr(OverDraft):
    """Each round, a model-free proposer's guesses (`cheap`) where `takes` accepts them, else the
    draft model's. The draft's cache falls behind in the cheap rounds; its next proposal feeds
    the tokens it missed in one block. Lossless like either part: the engine verifies whichever
    proposal comes, with the distribution it was drawn from."""

    may_lag = True  # its draft is not called in the cheap rounds
    cheap: object  # a proposers.lookup.ModelFree
    _drafted = False  # whether the draft made the last proposal
    # Rounds of the last generation the draft proposed: advise prices a hybrid round from
    # this share of draft rounds (the others cost no draft step).
    draft_rounds = 0

    def takes(self, found: Proposal, k: int) -> bool:
        """Whether the cheap guesses `found` are this round's proposal (else the draft's)."""
        raise NotImplementedError

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        self.draft_rounds = 0
        self.draft.begin(prompt, vocab_size, reuse)
        self.cheap.begin(prompt, vocab_size, reuse)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        return drive(self.drafting(seq, k, cfg, generator), self.draft.lm)

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        found = self.cheap.propose(seq, k, cfg, generator)
        self._drafted = not self.takes(found, k)
        self.draft_rounds += self._drafted
        if self._drafted:
            return (yield from self.draft.drafting(seq, min(k, self.draft.k), cfg, generator))
        return found

    def observe(self, proposed: int, accepted: int) -> None:
        if self._drafted:  # the draft's policy learns from its own rounds only
            self.draft.observe(proposed, accepted)

    def finish(self, tokens: torch.Tensor) -> None:
        self.cheap.finish(tokens)
        self.draft.finish(tokens)


class Hybrid(EitherOr):
    """Guesses from an n-gram match if there is one (free: no model call), else from the draft."""

    def __init__(self, draft: DraftModel, lookup: PromptLookup):
        self.draft, self.lookup = draft, lookup
        self.k = draft.k

    @property
    def cheap(self) -> PromptLookup:
        return self.lookup

    def takes(self, found: Proposal, k: int) -> bool:
        return bool(found.tokens.numel())

    def fork(self, slots: int = 256) -> Hybrid:
        return Hybrid(self.draft.fork(slots), self.lookup)
