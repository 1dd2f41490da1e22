"""What guesses the next tokens. Every proposer has `k`, `begin(prompt, vocab_size)`,
`propose(seq, k, cfg, generator) -> Proposal` and `rollback(committed_len)`."""

from ..decode.proposal import Proposal, Proposer
from .draft import DraftModel
from .hybrid import Hybrid
from .lookup import PromptLookup
from .tree import TreeDraft

__all__ = ["DraftModel", "Hybrid", "PromptLookup", "Proposal", "Proposer", "TreeDraft"]
