"""GGUF files as specdec runs them, one way down: a registry name or a path resolves to a file
(where), its metadata to the model's shapes, end ids and tokens (metadata), kept once in the
model cache with its tokenizer (store), a draft checked against a target (pair); the weights are
read by runtime.native.weight_source and run by the native runtime (runtime.native.loader). Nothing here imports
transformers except to build or load the tokenizer."""

from .metadata import GgufModel
from .pair import check_pair
from .store import prepared, tokenizer, tokenizer_of
from .where import gguf_path, is_gguf

__all__ = ["GgufModel", "check_pair", "gguf_path", "is_gguf", "prepared", "tokenizer", "tokenizer_of"]
