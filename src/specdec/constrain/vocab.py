"""A model's vocabulary as llguidance reads it: the tokenizer's byte strings over the target's
logits columns (ids past the tokenizer's own are never allowed), with the model's end ids as the
grammar's end. Building it reads every token (~1 s for 151,936 ids), so it is made once per
tokenizer, width and end ids."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


def vocab_of(tokenizer, width: int, end_ids: Sequence[int]):
    """llguidance's LLTokenizer for a fast Hugging Face `tokenizer` scoring `width` logits
    columns, whose grammar-complete state allows exactly `end_ids`."""
    return _cached(tokenizer, int(width), tuple(sorted(int(t) for t in end_ids)))


@lru_cache(maxsize=4)  # a process serves one or two tokenizers
def _cached(tokenizer, width: int, end_ids: tuple[int, ...]):
    import llguidance.hf

    from ..errors import SpecdecError

    if not end_ids:
        raise SpecdecError("a grammar needs the model's end token ids, to end once the grammar is complete")
    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=max(width, len(tokenizer)), eos_token=list(end_ids))
    except ValueError as e:  # a slow (Python) tokenizer
        raise SpecdecError(f"grammars need a fast (Rust) Hugging Face tokenizer: {e}") from None
