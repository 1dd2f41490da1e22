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
