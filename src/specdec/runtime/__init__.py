"""specdec's own runtime for Llama-family models (Llama, Qwen2, Qwen3; GGUF files) on its Q4/Q8 kernels:
one C++ call per forward (kernels/decoder.cpp), every row's logits independent of the block it
is computed in, behind the engine's model interface (NativeLM). docs/runtime.md."""

from .lm import NativeLM
from .load import CAPACITY, from_transformers, load_gguf, tokenizer_of

__all__ = ["CAPACITY", "NativeLM", "from_transformers", "load_gguf", "tokenizer_of"]
