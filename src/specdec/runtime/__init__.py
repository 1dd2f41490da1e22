"""specdec's own runtime for Llama-family models (Llama, Qwen2, Qwen3; GGUF files) on its Q4/Q5/Q8
kernels: one C++ call per forward (kernels/decoder.cpp), every row's logits independent of the
block it is computed in, behind the engine's model interface (NativeLM). docs/runtime.md."""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lm import NativeLM
    from .load import CAPACITY, from_transformers, load_gguf

__all__ = ["CAPACITY", "NativeLM", "from_transformers", "load_gguf"]
_HOMES = {"NativeLM": "lm", "CAPACITY": "load", "from_transformers": "load", "load_gguf": "load"}


def __getattr__(name: str):  # imported on first use: runtime.choose alone is needed to parse arguments
    if name not in _HOMES:
        raise AttributeError(f"module 'specdec.runtime' has no attribute {name!r}")
    return getattr(import_module(f".{_HOMES[name]}", __name__), name)
