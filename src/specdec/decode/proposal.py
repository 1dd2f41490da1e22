"""What a proposer hands the engine (Proposal) and what the engine needs of a proposer (Proposer)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .interface import Runtime
from .sampling import SamplingConfig


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


# A proposer's guessing as a conversation (Proposer.drafting): it yields the tokens to feed its
# draft model, is sent the draft's last logits row after them, and returns its Proposal; so a
# caller can run the draft steps of several sequences in one forward (decode.batch).
Drafting = Generator[torch.Tensor, torch.Tensor, "Proposal"]


def drive(steps: Drafting, lm: Runtime) -> Proposal:
    """Run a drafting conversation on the proposer's own draft model, a forward per step."""
    try:
        tokens = next(steps)
        while True:
            tokens = steps.send(lm.forward(tokens, last_only=True)[-1])
    except StopIteration as done:
        return done.value


def settled(proposal: Proposal) -> Drafting:
    """A drafting conversation that needs no draft forward (its proposal is already made)."""
    return proposal
    yield  # unreachable: makes this a generator


@runtime_checkable
class Proposer(Protocol):
    """What the engine needs of whatever guesses: the most tokens a round guesses, the draft
    model whose cache it checks every round (if any), and the round's hooks. Callers reach a
    proposer through these members only (tests/test_layers.py)."""

    k: int
    # The draft may lag the committed sequence by more than a DraftModel's one or two positions
    # (never run ahead of it): a hybrid's draft is not called in its lookup rounds.
    may_lag: bool

    @property
    def draft_lm(self) -> Runtime | None:
        """The draft model's runtime, None for a model-free proposer."""

    @property
    def calls(self) -> int:
        """Model forwards made for this sequence (0 for model-free proposers)."""

    def begin(self, prompt: torch.Tensor, vocab_size: int, reuse: bool = False) -> None:
        """Start a new sequence whose prompt is `prompt`; `reuse` may keep state that already
        covers the prompt's prefix (see Runtime.prefill)."""

    def propose(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Proposal:
        """Guess up to `k` tokens following the committed sequence `seq`."""

    def drafting(
        self, seq: torch.Tensor, k: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> Drafting:
        """The same guesses as propose's, as a conversation whose draft forwards the caller runs
        (a model-free proposer's needs none: settled(propose(...)))."""

    def fork(self, slots: int = 256) -> Proposer:
        """A proposer for another sequence decoded at the same time: its own draft cache (a lane
        of the same weights with room for `slots` positions) and its own policy state."""

    def observe(self, proposed: int, accepted: int) -> None:
        """Verification accepted `accepted` of the `proposed` tokens of the last proposal."""

    def rollback(self, committed_len: int) -> None:
        """Forget everything past the committed sequence (minus its pending last token)."""

    def finish(self, tokens: torch.Tensor) -> None:
        """The sequence ended as `tokens` (its prompt and output): a proposer that remembers
        across requests learns it; the others do nothing."""
