"""A cheaper draft: int8 weights for its linear layers (dynamic quantization: weights stored as
int8 per tensor, activations quantized on the fly), which cuts the bytes a draft step reads by 4x
against float32. Lossless all the same: the draft only proposes, the target decides."""

from __future__ import annotations

import warnings

import torch
from transformers import PreTrainedModel

from .errors import SpecdecError
from .forward import is_prepared

PREPARED_FIX = ("was already run by specdec, which repacked its weights for its forward: make int8 or "
                "restricted-head copies of a draft before the first generation")


def int8_draft(model: PreTrainedModel) -> PreTrainedModel:
    """Quantize `model`'s nn.Linear layers (the LM head included) to int8, in place; returns it.
    The embedding stays in float: a step reads one of its rows."""
    if is_prepared(model):
        raise SpecdecError(f"this model {PREPARED_FIX}")
    if model.device.type != "cpu":
        raise SpecdecError("int8 drafts use PyTorch's CPU int8 kernels: drop --draft-int8 on other devices")
    model.float()  # dynamic int8 kernels take float32 activations
    with warnings.catch_warnings():
        # torch marks its quantized tensor types as deprecated in favour of torchao; the kernels
        # are the ones that run fast on this CPU today.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


# quant=NAME in a method spec (specdec.method) -> the function that quantizes a model in place.
QUANTIZERS = {"int8": int8_draft}
