"""The runtimes a model runs on, side by side behind one contract (decode.interface.Runtime):
native/, specdec's own decoder for Llama-family models on its Q4/Q5/Q8 kernels; hf/ (next), a
transformers model repacked for a block-invariant forward. choose says which one runs a model;
pool holds the native decoder's cache slots shared by a batch's lanes."""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .native.loader import CAPACITY, from_transformers, load_gguf
    from .native.native_lm import NativeLM

__all__ = ["CAPACITY", "NativeLM", "from_transformers", "load_gguf"]
_HOMES = {"NativeLM": "native.native_lm", "CAPACITY": "native.loader", "from_transformers": "native.loader",
          "load_gguf": "native.loader"}


def __getattr__(name: str):  # imported on first use: runtime.choose alone is needed to parse arguments
    if name not in _HOMES:
        raise AttributeError(f"module 'specdec.runtime' has no attribute {name!r}")
    return getattr(import_module(f".{_HOMES[name]}", __name__), name)
