"""A draft model's chain of guesses plus, at each depth, its next most likely tokens as
alternative leaves: the target scores the whole tree in one forward (verify_tree)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..decode.proposal import Drafting, Proposal, drive
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError
from .draft import DraftModel, OverDraft, guess

if TYPE_CHECKING:
    from ..runtime.hf.causal_lm import CausalLM


class TreeDraft(OverDraft):
    """Proposes the draft's chain of up to k tokens (greedy, or sampled from q as DraftModel
    does) and, beside the chain token at each depth, up to width-1 alternatives: the draft's
    most likely other tokens there. Alternatives are leaves, so they cost no draft forward;
    they are placed after the chain token among its siblings, so the verifier tries the chain
    first, and they are deterministic (point-mass) candidates fixed by the draft's logits and
    the chain token, which keeps sampling exact (see verify_tree).

    The draft's k and policy hold for the chain: a confidence floor judges the draft's top
    probability at each depth, a schedule the accepted depth (specdec.methods refuses pay=1 with
    a width: the pay rule's terms are a chain's).
    """

    may_lag = False

    def __init__(self, draft: DraftModel, width: int = 2):
        if width < 1:
            raise SpecdecError(f"width must be >= 1, got {width}")
        self.k = draft.k
        self.draft, self.width = draft, width
        self._chain = 0  # depth of the last proposal's chain

    @property
    def lm(self) -> CausalLM:
        return self.draft.lm

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        self.draft.begin(prompt, vocab_size, reuse)

    def fork(self, slots: int = 256) -> TreeDraft:
        return TreeDraft(self.draft.fork(slots), self.width)

    @torch.inference_mode()
    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        return drive(self.drafting(seq, k, cfg, generator), self.lm)

    def drafting(self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None) -> Drafting:
        # After an accepted alternative the draft's cache holds the chain token at that
        # position: keep only what agrees with the committed sequence, then feed the rest.
        self.lm.keep_prefix_of(seq[:-1])
        logits = self.draft.spread((yield seq[self.lm.length :]))
        chain, qs, alternatives = [], [], []  # alternatives: (depth, token)
        # The draft's top probability decides only where the policy reads it; reading it is a
        # softmax over the vocabulary and a host sync, so skip it otherwise.
        policy = self.draft.policy
        sure: list[float] = []
        k = policy.budget(k)
        for depth in range(k):
            token = guess(logits, cfg, generator, qs)
            chain.append(token)
            alternatives += [(depth, t) for t in self._alternatives(logits, int(token))]
            if depth + 1 == k:
                break
            if policy.reads_confidence:
                sure.append(float((qs[-1] if qs else torch.softmax(logits, -1)).max()))
                if not policy.guess_again(sure):
                    break
            logits = self.draft.spread((yield token))
        self._chain = len(chain)
        return _layout(chain, qs, alternatives)

    def _alternatives(self, logits: torch.Tensor, chosen: int) -> list[int]:
        """The draft's width-1 most likely tokens other than the chain's (a restricted head
        leaves the ids it cannot score at -inf: never propose those)."""
        values, ids = torch.topk(logits, min(self.width, logits.numel()))
        top = ids[torch.isfinite(values)].tolist()
        return [t for t in top if t != chosen][: self.width - 1]

    def observe(self, proposed: int, accepted: int) -> None:
        """`proposed` counts the alternatives too; the policy judges the chain's depth."""
        self.draft.observe(self._chain, accepted)



def _layout(
    chain: list[torch.Tensor], qs: list[torch.Tensor], alternatives: list[tuple[int, int]]
) -> Proposal:
    """Nodes: the chain (node d at depth d+1, child of node d-1), then the alternatives, each a
    sibling of the chain node at its depth, so every parent precedes its children and the
    chain node comes first among its siblings."""
    m = len(chain)
    tokens = torch.cat(chain + [chain[0].new_tensor([t]) for _, t in alternatives])
    parents = torch.tensor([d - 1 for d in range(m)] + [d - 1 for d, _ in alternatives])
    if not qs:
        return Proposal(tokens, parents=parents)
    # Alternatives are point masses; their q rows are never read (zeros keep the shape).
    q = torch.cat([torch.stack(qs), qs[0].new_zeros(len(alternatives), qs[0].numel())])
    sampled = torch.tensor([True] * m + [False] * len(alternatives))
    return Proposal(tokens, q, parents=parents, sampled=sampled)
