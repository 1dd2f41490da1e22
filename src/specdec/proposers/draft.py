"""A small draft model proposes k tokens autoregressively over its own KV cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..adaptive import PayRule
from ..errors import SpecdecError
from ..lm import CausalLM
from ..sampling import SamplingConfig, draw, probs
from .base import Proposal

# A draft whose output layer scores only some token ids (specdec.draft_head makes one) carries
# those ids, sorted, as this attribute of the model: its row i scores token HEAD_IDS[i].
HEAD_IDS = "specdec_head_ids"


class DraftModel:
    """Draft-model proposer. Its cache holds a prefix of the committed sequence: all of it but
    the pending last token, or one token less after a round in which every guess was accepted
    (the last guess was never fed back); `propose` first feeds what it has not seen."""

    def __init__(
        self,
        model: PreTrainedModel | CausalLM,
        k: int = 5,
        min_confidence: float = 0.0,
        pay_rule: PayRule | None = None,
    ):
        """`model` may be a CausalLM whose cache later drafts reuse (generate's reuse_prefix),
        or a runtime.NativeLM (its restricted head's ids as its `head_ids`).

        Adaptive k: with `min_confidence` > 0 a round stops guessing after a position where the
        draft's probability of its guess is below it; with `pay_rule` (specdec.adaptive) it stops
        when the cost model expects one more guess not to pay. Uncertain rounds then send
        shorter, cheaper blocks to the target; k is the most a round guesses. The stop depends
        on the draft alone, so sampling stays exact. Either reads a probability back per guess
        (a host synchronisation on CUDA).
        """
        if k < 1:
            raise SpecdecError(f"k must be >= 1, got {k}")
        if not 0.0 <= min_confidence < 1.0:
            raise SpecdecError(f"min_confidence must lie in [0, 1), got {min_confidence}")
        self.k, self.min_confidence, self.pay_rule = k, min_confidence, pay_rule
        self.lm = CausalLM(model, invariant=False) if isinstance(model, PreTrainedModel) else model
        # A head restricted to some token ids (specdec.draft_head) scores only those; their
        # logits are spread back over the full vocabulary, the rest at -inf (q = 0 there).
        self._head_ids = (getattr(self.lm.model, HEAD_IDS, None) if isinstance(self.lm, CausalLM)
                          else getattr(self.lm, "head_ids", None))
        # ids the draft can score: read once here, not per sequence (a host read on CUDA)
        self._scored = self.lm.vocab_size if self._head_ids is None else int(self._head_ids.max()) + 1
        self._vocab = self._scored

    @property
    def calls(self) -> int:
        return self.lm.calls

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        if self._head_ids is None:
            self._vocab = min(vocab_size, self._scored)
        elif self._scored > vocab_size:
            raise SpecdecError("the draft's restricted head scores token ids the target does not have")
        else:
            self._vocab = vocab_size
        self.lm.prefill(prompt, reuse=reuse)

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `tokens` to the draft; its logits for the next token over the target's
        vocabulary [vocab] (only the target's ids can be proposed: a head may carry padding rows)."""
        row = self.lm.forward(tokens, last_only=True)[-1]
        if self._head_ids is None:
            return row[: self._vocab]
        full = torch.full((self._vocab,), float("-inf"), device=row.device)
        return full.index_copy_(0, self._head_ids, row)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        # rollback left the cache a prefix of the committed sequence: feed what it has not seen.
        logits = self.next_logits(seq[self.lm.length :])
        tokens, qs, sure = [], [], []
        adaptive = self.min_confidence > 0 or self.pay_rule is not None
        for i in range(k):
            if cfg.greedy:
                token = logits.argmax(-1, keepdim=True)
            else:
                qs.append(probs(logits, cfg))
                token = draw(qs[-1], generator)
            tokens.append(token)
            if i + 1 == k or (adaptive and self._stop(sure, logits, qs, token)):
                break
            logits = self.next_logits(token)
        return Proposal(torch.cat(tokens), torch.stack(qs) if qs else None)

    def _stop(self, sure: list[float], logits: torch.Tensor, qs: list[torch.Tensor], token: torch.Tensor) -> bool:
        """Adaptive k: record the draft's probability of the token just guessed in `sure`;
        True when it is below min_confidence or the pay rule says another guess won't pay."""
        q = qs[-1] if qs else torch.softmax(logits, -1)
        sure.append(float(q[token]))
        if sure[-1] < self.min_confidence:
            return True
        return self.pay_rule is not None and not self.pay_rule.guess_again(sure)

    def rollback(self, committed_len: int) -> None:
        self.lm.trim(min(self.lm.length, committed_len - 1))
