"""A proposer that remembers across requests: the longest match of the sequence's last tokens in
a memory of earlier requests' prompts and outputs (SuffixStore) and in the sequence itself, and
the continuation most of its occurrences agree on, as long as it stays probable (the idea of
SuffixDecoding, Oliaro et al.). And its hybrid with the draft model: the memory's confident
guesses, else the draft's.

The memory learns every sequence when it ends (Proposer.finish with its prompt and output, told
by decode.sequence when the sequence's result is read: generate, a batch, the server)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..decode.proposal import Proposal
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError
from .draft import DraftModel
from .hybrid import EitherOr
from .lookup import ModelFree
from .suffix_store import SuffixStore, continuation, deepest, own_occurrences


class SuffixProposer(ModelFree):
    """Model-free and deterministic, so its q is a point mass on each proposed token (lossless
    under sampling as prompt lookup is). Forks share the memory (`store`).

    `max_depth`: the longest context matched; `floor`: a guess is made only while the
    continuation's empirical probability (the product of its steps' shares) stays >= floor;
    `factor`: at most ceil(factor x match length) guesses, so a short match guesses little."""

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


class SuffixHybrid(EitherOr):
    """Each round, the memory's guesses where it expects to have at least as many accepted as the
    draft guesses (draft.k: a draft round accepts at most that and costs its draft steps), else
    the draft's. The memory may guess up to its own k, longer than the draft's."""

    def __init__(self, draft: DraftModel, memory: SuffixProposer):
        self.draft, self.memory = draft, memory
        self.k = max(memory.k, draft.k)

    @property
    def cheap(self) -> SuffixProposer:
        return self.memory

    def takes(self, found: Proposal, k: int) -> bool:
        return self.memory.expected >= min(k, self.draft.k)

    def fork(self, slots: int = 256) -> SuffixHybrid:
        return SuffixHybrid(self.draft.fork(slots), self.memory.fork(slots))
