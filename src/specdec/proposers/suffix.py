"""A proposer that remembers across requests: the longest match of the sequence's last tokens in
a memory of earlier requests' prompts and outputs (SuffixStore) and in the sequence itself, and
the continuation most of its occurrences agree on, as long as it stays probable (the idea of
SuffixDecoding, Oliaro et al.). And its hybrid with the draft model: the memory's confident
guesses, else the draft's.

The memory learns a sequence when told it ended (`finish(tokens)`, its prompt and output): a
caller that decodes several requests calls it for each (the engine has no such hook)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..decode.proposal import Drafting, Proposal, drive, settled
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError
from .draft import DraftModel, OverDraft
from .suffix_store import SuffixStore, continuation, deepest, own_occurrences


class SuffixProposer:
    """Model-free and deterministic, so its q is a point mass on each proposed token (lossless
    under sampling as prompt lookup is). Forks share the memory (`store`).

    `max_depth`: the longest context matched; `floor`: a guess is made only while the
    continuation's empirical probability (the product of its steps' shares) stays >= floor;
    `factor`: at most ceil(factor x match length) guesses, so a short match guesses little."""

    calls = 0
    draft_lm = None
    may_lag = False

    def __init__(self, k: int = 8, max_depth: int = 32, floor: float = 0.1, factor: float = 1.0,
                 store: SuffixStore | None = None):
        if k < 1:
            raise SpecdecError(f"k must be >= 1, got {k}")
        if max_depth < 1:
            raise SpecdecError(f"max_depth must be >= 1, got {max_depth}")
        if not 0.0 < floor <= 1.0:
            raise SpecdecError(f"floor must lie in (0, 1], got {floor}")
        if factor <= 0:
            raise SpecdecError(f"factor must be > 0, got {factor}")
        self.k, self.max_depth, self.floor, self.factor = k, max_depth, floor, factor
        self.store = store if store is not None else SuffixStore()
        self.expected = 0.0  # the last proposal's expected accepted tokens (its path probabilities)

    def fork(self, slots: int = 256) -> SuffixProposer:
        return SuffixProposer(self.k, self.max_depth, self.floor, self.factor, self.store)

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        pass

    def finish(self, tokens: torch.Tensor | Sequence[int]) -> None:
        """A sequence ended: remember its prompt and output (`tokens`) for later requests."""
        self.store.add(torch.as_tensor(tokens).cpu().numpy())

    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        tokens, self.expected = self.guess(seq.cpu().numpy(), k)
        return Proposal(torch.tensor(tokens, dtype=seq.dtype, device=seq.device))

    def guess(self, seq: np.ndarray, k: int) -> tuple[list[int], float]:
        """Up to k tokens to follow `seq`, and how many of them are expected to be accepted."""
        mem_depth, mem = deepest(self.store.occurrences(int(seq[-1])), seq, self.max_depth)
        own_depth, own = deepest(own_occurrences(seq), seq, self.max_depth)
        depth = max(mem_depth, own_depth)
        if not depth:
            return [], 0.0
        found = [occ for d, occ in ((mem_depth, mem), (own_depth, own)) if d == depth]
        tokens, expected = continuation(found, min(k, math.ceil(self.factor * depth)), self.floor)
        if tokens and mem_depth == depth:
            self.store.touch(mem.ends)
        return tokens, expected

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        """propose's guesses as a conversation that needs no draft forward."""
        return settled(self.propose(seq, k, cfg, generator))

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def rollback(self, committed_len: int) -> None:
        pass


class SuffixHybrid(OverDraft):
    """Each round, the memory's guesses where it expects to have at least as many accepted as the
    draft guesses (draft.k: a draft round accepts at most that and costs its draft steps), else
    the draft's. The memory may guess up to its own k, longer than the draft's. The draft's cache
    falls behind in memory rounds and catches up in its next one, as Hybrid's does."""

    may_lag = True  # its draft is not called in memory rounds

    def __init__(self, draft: DraftModel, memory: SuffixProposer):
        self.draft, self.memory = draft, memory
        self.k = max(memory.k, draft.k)
        self._drafted = False  # whether the draft made the last proposal
        self.draft_rounds = 0  # rounds of the last generation the draft proposed (as Hybrid's)

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        self.draft_rounds = 0
        self.draft.begin(prompt, vocab_size, reuse)

    def fork(self, slots: int = 256) -> SuffixHybrid:
        return SuffixHybrid(self.draft.fork(slots), self.memory.fork(slots))

    def finish(self, tokens: torch.Tensor | Sequence[int]) -> None:
        """A sequence ended: the memory learns it (SuffixProposer.finish)."""
        self.memory.finish(tokens)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        return drive(self.drafting(seq, k, cfg, generator), self.draft.lm)

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        found = self.memory.propose(seq, k, cfg, generator)
        self._drafted = self.memory.expected < min(k, self.draft.k)
        self.draft_rounds += self._drafted
        if self._drafted:
            return (yield from self.draft.drafting(seq, min(k, self.draft.k), cfg, generator))
        return found

    def observe(self, proposed: int, accepted: int) -> None:
        if self._drafted:  # the draft's policy learns from its own rounds only
            self.draft.observe(proposed, accepted)
