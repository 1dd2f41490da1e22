"""What guesses the next tokens: a draft model, prompt lookup, both (hybrid), a draft's tree; and
the policies of adaptive k. Each is a specdec.decode.proposal.Proposer."""

from ..decode.proposal import Proposal, Proposer
from .draft import DraftModel
from .hybrid import Hybrid
from .lookup import PromptLookup
from .tree import TreeDraft

__all__ = ["DraftModel", "Hybrid", "PromptLookup", "Proposal", "Proposer", "TreeDraft"]
