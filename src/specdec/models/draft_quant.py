"""A cheaper draft: `quant=int8` or `quant=int4` in a draft method spec. Lossless all the same:
the draft only proposes, the target decides.

- int8: specdec's Q8 layers (specdec.quant, the kernels a target uses) where the CPU runs their
  AVX-512 VNNI path, else torch's dynamic int8 linear layers (weights int8 per tensor,
  activations quantized per call; fbgemm's int8 GEMM, fast on AVX2). Measured on the 0.5B draft
  in bf16, one decode step, interleaved (AMD Zen 5, docs/quant.md): Q8 14.4 ms, dynamic int8
  17.2 ms, Q4 10.9 ms. specdec's AVX2 path was not measured against fbgemm on an AVX2 CPU.
- int4: specdec.quant's Q4 layers (a registry draft from its own GGUF, cached:
  specdec.models.quant_cache), the same layers an int4 target runs.
"""

from __future__ import annotations

import warnings

import torch
from transformers import PreTrainedModel

from .. import kernels
from ..errors import SpecdecError
from ..runtime.hf.model_facts import PREPARED_FIX, is_prepared
from .quant_cache import quantize_model
from .quant_options import check_options


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
    check_options(quant, group, str(model.device), source)
    if quant == "int8" and kernels.vector_path() != "avx512-vnni":
        return int8_draft(model)
    return quantize_model(model, source, quant, group)
