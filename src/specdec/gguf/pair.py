"""Whether a draft GGUF may propose for a target GGUF, judged from their metadata before any
weight loads: speculation compares token ids, so every id the two share must be the same text.
As llama.cpp judges a pair: the same tokenizer model, vocabularies within 128 ids of each other
(files pad them differently), and the same text for every shared id from 5 on (the first few
control tokens are allowed to differ)."""

from __future__ import annotations

from ..errors import SpecdecError
from .metadata import GgufModel

MAX_SIZE_DIFFERENCE = 128
FIRST_COMPARED = 5


def check_pair(target: GgufModel, draft: GgufModel) -> None:
    """Raise a one-line SpecdecError naming what differs, else return."""
    fix = "use a draft of the target's family (same tokenizer), or --proposer lookup, which needs no draft model"
    if target.tokenizer_model != draft.tokenizer_model:
        raise SpecdecError(f"the target's tokenizer is {target.tokenizer_model!r} and the draft's "
                           f"{draft.tokenizer_model!r}; {fix}")
    if target.tokens_digest == draft.tokens_digest:  # the same token texts: nothing to compare
        return
    sizes = len(target.tokens), len(draft.tokens)
    if abs(sizes[0] - sizes[1]) > MAX_SIZE_DIFFERENCE:
        raise SpecdecError(f"the target's tokenizer has {sizes[0]} tokens and the draft's {sizes[1]} "
                           f"(more than {MAX_SIZE_DIFFERENCE} apart); {fix}")
    for i in range(FIRST_COMPARED, min(sizes)):
        if target.tokens[i] != draft.tokens[i]:
            raise SpecdecError(f"token {i} is {target.tokens[i]!r} to the target and {draft.tokens[i]!r} to the "
                               f"draft; {fix}")
