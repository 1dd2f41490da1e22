"""specdec: lossless speculative decoding of language models on the CPU (GGUF files on its own
runtime, Hugging Face folders on transformers' model), and the measurements that say whether it pays."""

from importlib import import_module
from typing import TYPE_CHECKING

from .errors import SpecdecError

if TYPE_CHECKING:
    from .decode.engine import GenerationResult, generate
    from .decode.sampling import SamplingConfig
    from .decode.stats import GenerationStats
    from .models.load import load_model
    from .prompts.chat import encode_prompt
    from .proposers import DraftModel, Hybrid, PromptLookup, TreeDraft
    from .runtime.native.loader import gguf_model as load_gguf

# Where each public name lives: imported on first use, so that `specdec --help` and commands
# that need no model do not import torch and transformers (seconds).
_HOMES = {"GenerationResult": "decode.engine", "generate": "decode.engine", "SamplingConfig": "decode.sampling",
          "GenerationStats": "decode.stats", "load_model": "models.load", "encode_prompt": "prompts.chat",
          "DraftModel": "proposers", "Hybrid": "proposers", "PromptLookup": "proposers", "TreeDraft": "proposers",
          "load_gguf": ("runtime.native.loader", "gguf_model")}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    home = _HOMES[name]
    module, attribute = home if isinstance(home, tuple) else (home, name)
    return getattr(import_module(f".{module}", __name__), attribute)


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
    "load_gguf",
    "load_model",
]
