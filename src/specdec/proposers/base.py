"""The proposer interface shared by the engine and every kind of guesser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..sampling import SamplingConfig


@dataclass
class Proposal:
    tokens: torch.Tensor  # [n] proposed tokens, n <= the k asked for (0 = nothing to propose)
    q: torch.Tensor | None = None  # [n, vocab] distributions they were drawn from; None = point mass
    # Tree proposals only (None = a chain, tokens[i] follows tokens[i-1]): parents[i] is the
    # index of node i's parent, -1 for a child of the pending token; parents come before their
    # children and siblings are tried in index order (see verify_tree).
    parents: torch.Tensor | None = None
    # Tree proposals only: True where node i was drawn from q[i], False where it was chosen
    # deterministically (a point mass; its q row is ignored). None = all deterministic.
    sampled: torch.Tensor | None = None


class Proposer(Protocol):
    k: int

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        """Start a new sequence whose prompt is `prompt`; `reuse` may keep state that already
        covers the prompt's prefix (see CausalLM.prefill)."""

    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        """Guess up to `k` tokens following the committed sequence `seq`."""

    def rollback(self, committed_len: int) -> None:
        """Forget everything past the committed sequence (minus its pending last token)."""

    @property
    def calls(self) -> int:
        """Model forwards made for this sequence (0 for model-free proposers)."""
