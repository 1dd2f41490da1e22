"""A small draft model proposes k tokens autoregressively over its own KV cache."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from ..decode.proposal import Drafting, Proposal, drive
from ..decode.sampling import SamplingConfig, draw, probs
from ..errors import SpecdecError
from .policy import Policy

if TYPE_CHECKING:  # a native draft never imports transformers' model classes (seconds at start-up)
    from transformers import PreTrainedModel

    from ..runtime.hf.causal_lm import CausalLM


class DraftModel:
    """Draft-model proposer. Its cache holds a prefix of the committed sequence: all of it but
    the pending last token, or one token less after a round in which every guess was accepted
    (the last guess was never fed back); `propose` first feeds what it has not seen."""

    def __init__(
        self,
        model: PreTrainedModel | CausalLM,
        k: int = 5,
        policy: Policy | None = None,
    ):
        """`model` may be a runtime (decode.interface.Runtime: a CausalLM, a runtime.NativeLM)
        whose cache later drafts reuse (generate's reuse_prefix).

        Adaptive k: a `policy` (specdec.proposers.policy) decides how many of its k tokens a
        round guesses, from the draft's probabilities of its guesses (a confidence floor, the
        cost model's pay rule: uncertain rounds send shorter, cheaper blocks to the target) or
        from what earlier rounds accepted. None: k every round. A policy that reads the
        probabilities reads one back per guess (a host synchronisation on CUDA).
        """
        if k < 1:
            raise SpecdecError(f"k must be >= 1, got {k}")
        self.k, self.policy = k, policy or Policy()
        self.lm = _draft_lm(model) if isinstance(model, torch.nn.Module) else model
        # A head restricted to some token ids (specdec.models.draft_head) scores only those; their
        # logits are spread back over the full vocabulary, the rest at -inf (q = 0 there).
        self._head_ids = self.lm.head_ids
        # ids the draft can score: read once here, not per sequence (a host read on CUDA)
        self._scored = self.lm.vocab_size if self._head_ids is None else int(self._head_ids.max()) + 1
        self._vocab = self._scored

    may_lag = False

    @property
    def draft_lm(self) -> CausalLM:
        return self.lm

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
        self.policy.begin()
        self.lm.prefill(prompt, reuse=reuse)

    def fork(self, slots: int = 256) -> DraftModel:
        """A draft proposer for another sequence decoded beside this one: its own cache (a lane
        of the same weights, starting with `slots` positions) and its own policy state."""
        return DraftModel(self.lm.lane(slots), self.k, copy.deepcopy(self.policy))

    def scores(self, row: torch.Tensor) -> torch.Tensor:
        """The draft's last logits row over the ids it may propose: a restricted head's columns
        (ids: its head_ids, ascending), else the target's vocabulary. Guessing over the head's
        ~33k columns instead of the 152k of the spread row spares the sampling filters' passes."""
        return row if self._head_ids is not None else row[: self._vocab]

    def spread(self, row: torch.Tensor) -> torch.Tensor:
        """The draft's last logits row over the target's vocabulary [vocab] (only the target's
        ids can be proposed: a head may carry padding rows)."""
        if self._head_ids is None:
            return row[: self._vocab]
        full = torch.full((self._vocab,), float("-inf"), device=row.device)
        return full.index_copy_(0, self._head_ids, row)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        return drive(self.drafting(seq, k, cfg, generator), self.lm)

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        # rollback left the cache a prefix of the committed sequence: feed what it has not seen.
        row = self.scores((yield seq[self.lm.length :]))
        tokens, qs, sure = [], [], []
        k = self.policy.budget(k)
        for i in range(k):
            token = guess(row, cfg, generator, qs, self._head_ids, self._vocab)
            tokens.append(token)
            if i + 1 == k or (self.policy.reads_confidence and not self._again(sure, row, qs, token)):
                break
            row = self.scores((yield token))
        return Proposal(torch.cat(tokens), torch.stack(qs) if qs else None)

    def _again(self, sure: list[float], row: torch.Tensor, qs: list[torch.Tensor], token: torch.Tensor) -> bool:
        """Record the draft's probability of the token just guessed in `sure` (greedy: the
        row's largest, sampled: q's at the token); whether the policy guesses again after it."""
        sure.append(float(qs[-1][token] if qs else torch.softmax(row, -1).max()))
        return self.policy.guess_again(sure)

    def observe(self, proposed: int, accepted: int) -> None:
        self.policy.observe(proposed, accepted)

    def rollback(self, committed_len: int) -> None:
        self.lm.trim(min(self.lm.length, committed_len - 1))

    def finish(self, tokens: torch.Tensor) -> None:
        pass


def guess(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None, qs: list[torch.Tensor],
          ids: torch.Tensor | None = None, vocab: int = 0) -> torch.Tensor:
    """The draft's next token id (shape [1]): its argmax when greedy, else a draw from its
    distribution, which is appended to `qs` (the q the verifier judges the token by, over the
    target's `vocab`). `ids`: the token id of each of `logits`' columns (ascending, so a tie
    goes to the lowest id as over the full row), None where column i is id i."""
    if cfg.greedy:
        best = logits.argmax(-1, keepdim=True)
        return best if ids is None else ids[best]
    q = probs(logits, cfg)
    drawn = draw(q, generator)
    if ids is None:
        qs.append(q)
        return drawn
    qs.append(q.new_zeros(vocab).index_copy_(0, ids, q))
    return ids[drawn]


class OverDraft:
    """A proposer built around a DraftModel (`draft`): its runtime, calls and rollback are the
    draft's."""

    draft: DraftModel

    @property
    def draft_lm(self) -> CausalLM:
        return self.draft.lm

    @property
    def calls(self) -> int:
        return self.draft.calls

    def rollback(self, committed_len: int) -> None:
        self.draft.rollback(committed_len)

    def finish(self, tokens: torch.Tensor) -> None:
        self.draft.finish(tokens)


def _draft_lm(model):
    """A transformers draft in a CausalLM that keeps its logits in the model's dtype."""
    from ..runtime.hf.causal_lm import CausalLM

    return CausalLM(model, invariant=False)
