"""A small draft model proposes k tokens autoregressively over its own KV cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..errors import SpecdecError
from ..lm import CausalLM
from ..sampling import SamplingConfig, probs
from .base import Proposal


class DraftModel:
    """Draft-model proposer. Its cache holds a prefix of the committed sequence: all of it but
    the pending last token, or one token less after a round in which every guess was accepted
    (the last guess was never fed back); `propose` first feeds what it has not seen."""

    def __init__(self, model: PreTrainedModel | CausalLM, k: int = 5, min_confidence: float = 0.0):
        """`model` may be a CausalLM whose cache later drafts reuse (generate's reuse_prefix).

        Adaptive k: with `min_confidence` > 0 a round stops guessing after a position where the
        draft's top probability is below it, so uncertain rounds send shorter, cheaper blocks to
        the target; k is then the most a round guesses. The stop depends on the draft alone, so
        sampling stays exact.
        """
        if k < 1:
            raise SpecdecError(f"k must be >= 1, got {k}")
        if not 0.0 <= min_confidence < 1.0:
            raise SpecdecError(f"min_confidence must lie in [0, 1), got {min_confidence}")
        self.k, self.min_confidence = k, min_confidence
        self.lm = model if isinstance(model, CausalLM) else CausalLM(model)
        self._vocab = self.lm.vocab_size

    @property
    def calls(self) -> int:
        return self.lm.calls

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        self._vocab = min(vocab_size, self.lm.vocab_size)
        self.lm.prefill(prompt, reuse=reuse)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        # Only the target's vocabulary can be proposed (a head may carry padding rows).
        logits = self.lm.forward(seq[self.lm.length :], last_only=True)[-1, : self._vocab]
        tokens, qs = [], []
        for i in range(k):
            if cfg.greedy:
                token = logits.argmax(-1, keepdim=True)
            else:
                qs.append(probs(logits, cfg))
                token = torch.multinomial(qs[-1], 1, generator=generator)
            tokens.append(token)
            if i + 1 == k or (self.min_confidence and self._unsure(logits, qs)):
                break
            logits = self.lm.forward(token, last_only=True)[-1, : self._vocab]
        return Proposal(torch.cat(tokens), torch.stack(qs) if qs else None)

    def _unsure(self, logits: torch.Tensor, qs: list[torch.Tensor]) -> bool:
        """The token just guessed had a draft probability below min_confidence."""
        q = qs[-1] if qs else torch.softmax(logits, -1)
        return float(q.max()) < self.min_confidence

    def rollback(self, committed_len: int) -> None:
        self.lm.cache.trim(min(self.lm.length, committed_len - 1))
