"""What guesses the next tokens: a draft model, prompt lookup, both (hybrid), a draft's tree, a
memory of earlier requests (suffix); and the policies of adaptive k. Each is a
specdec.decode.proposal.Proposer."""

from ..decode.proposal import Proposal, Proposer
from .draft import DraftModel
from .hybrid import Hybrid
from .lookup import PromptLookup
from .suffix import SuffixHybrid, SuffixProposer
from .tree import TreeDraft

__all__ = ["DraftModel", "Hybrid", "PromptLookup", "Proposal", "Proposer", "SuffixHybrid", "SuffixProposer", "TreeDraft"]
