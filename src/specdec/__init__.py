"""specdec: lossless speculative decoding for Hugging Face causal LMs."""

from .decode.engine import GenerationResult, generate
from .decode.sampling import SamplingConfig
from .decode.stats import GenerationStats
from .errors import SpecdecError
from .models.load import load_model
from .prompts.chat import encode_prompt
from .proposers import DraftModel, Hybrid, PromptLookup, TreeDraft

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
