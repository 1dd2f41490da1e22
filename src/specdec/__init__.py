"""specdec: lossless speculative decoding for Hugging Face causal LMs."""

from .engine import GenerationResult, generate
from .errors import SpecdecError
from .proposers import DraftModel, PromptLookup
from .sampling import SamplingConfig
from .stats import GenerationStats

__all__ = [
    "DraftModel",
    "GenerationResult",
    "GenerationStats",
    "PromptLookup",
    "SamplingConfig",
    "SpecdecError",
    "generate",
]
