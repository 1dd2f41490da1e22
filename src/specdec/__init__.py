"""specdec: lossless speculative decoding for Hugging Face causal LMs."""

from .engine import GenerationResult, generate
from .errors import SpecdecError
from .models import load_model
from .prompts import encode_prompt
from .proposers import DraftModel, Hybrid, PromptLookup, TreeDraft
from .sampling import SamplingConfig
from .stats import GenerationStats

__all__ = [
    "DraftModel",
    "GenerationResult",
    "GenerationStats",
    "Hybrid",
    "PromptLookup",
    "SamplingConfig",
    "SpecdecError",
    "TreeDraft",
    "encode_prompt",
    "generate",
    "load_model",
]
