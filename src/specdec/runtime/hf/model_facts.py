"""What specdec reads off a transformers model besides its forward: the token ids its output
layer scores, its end ids, whether specdec already repacked it, and a restricted head's ids
(models.draft_head sets them). Attribute reads only, no transformers import: the loaders and the
native runtime's conversion of a dense model read these too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# A draft whose output layer scores only some token ids carries those ids, sorted, as this
# attribute of the model: its row i scores token HEAD_IDS[i] (CausalLM.head_ids reads it).
HEAD_IDS = "specdec_head_ids"
# The attribute a prepared model carries (runtime.hf.prepare): the options it was prepared with.
PREPARED = "specdec_prepared"
# Why a prepared model cannot be quantized or cut any more, and what to do instead.
PREPARED_FIX = ("was already run by specdec, which repacked its weights for its forward: make quantized or "
                "restricted-head copies of a draft before the first generation")


def is_prepared(model: PreTrainedModel) -> bool:
    return getattr(model, PREPARED, None) is not None


def logit_width(model: PreTrainedModel) -> int:
    """Rows of the model's output layer (token ids it scores)."""
    head = model.get_output_embeddings()
    # out_features also exists on quantized heads, whose weight is a method, not a tensor
    return getattr(head, "out_features", None) or head.weight.shape[0]


def eos_token_ids(model: PreTrainedModel) -> tuple[int, ...]:
    """The model's end-of-sequence ids from its generation config (generate's default)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    return () if eos is None else token_ids(eos)


def token_ids(value: int | Sequence[int]) -> tuple[int, ...]:
    """One token id or several, as a tuple."""
    return (value,) if isinstance(value, int) else tuple(int(t) for t in value)
