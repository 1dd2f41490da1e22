"""A cheaper draft: `quant=int8` or `quant=int4` in a draft method spec. Lossless all the same:
the draft only proposes, the target decides.

- int8: torch's dynamic int8 linear layers (weights int8 per tensor, activations quantized on
  the fly per call; fbgemm's int8 GEMM). Measured against the weight-only int8 layers of
  specdec.quant (which a target must use: a dynamic layer's activation scale depends on the
  whole block, so a row's result depends on the block) on the 0.5B draft, one step on a 2-core
  AVX2 CPU: dynamic 1 / 2 / 4 rows 402 / 355 / 337 ms against 472 / 451 / 569 ms (both on a
  heavily shared machine, interleaved; docs/quant.md), so drafts keep the dynamic one.
- int4: specdec.quant's weight-only int4 groups (a registry draft from its own GGUF, cached:
  specdec.quant.cache), the same layers an int4 target runs.
"""

from __future__ import annotations

import warnings

import torch
from transformers import PreTrainedModel

from .errors import SpecdecError
from .forward import PREPARED_FIX, is_prepared
from .quant.cache import quantize_model


def int8_draft(model: PreTrainedModel) -> PreTrainedModel:
    """Quantize `model`'s nn.Linear layers (the LM head included) to dynamic int8, in place;
    returns it. The embedding stays in float: a step reads one of its rows."""
    if is_prepared(model):
        raise SpecdecError(f"this model {PREPARED_FIX}")
    if model.device.type != "cpu":
        raise SpecdecError("int8 drafts use PyTorch's CPU int8 kernels: drop --draft-quant on other devices")
    model.float()  # dynamic int8 kernels take float32 activations
    with warnings.catch_warnings():
        # torch marks its quantized tensor types as deprecated in favour of torchao; the kernels
        # are the ones that run fast on this CPU today.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


def quantize_draft(model: PreTrainedModel, quant: str, source: str | None = None, group: int = 32) -> PreTrainedModel:
    """`model` as the draft of quant=`quant`, in place. `source` (the registry name or folder it
    was loaded from; None: rounded) and `group` say where int4 weights come from."""
    if quant == "int8":
        return int8_draft(model)
    return quantize_model(model, source, quant, group)
