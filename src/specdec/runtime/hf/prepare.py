"""specdec's forward: a Hugging Face model repacked in place so that each token's logits come from
the same arithmetic whether it is decoded alone or verified in a block (docs/design.md, "One
forward for every token"), on prepacked weights that read faster.

- linear layers: `PackedLinear` (oneDNN-prepacked where the CPU supports the dtype; short inputs
  padded to the block size the layer's probe found to keep a row's bits, see runtime.hf.linear);
- attention: row by row in decode and verify forwards (`attention.rows`);
- logits in float32 from the final norm on, for a target (`float32_logits`): bf16 logits are
  0.125 apart at 16-32, so exact ties between the two best tokens were common.

The model keeps its transformers classes and stays usable by transformers' own `generate`.
"""

from __future__ import annotations

import copy
import os

from typing import TYPE_CHECKING

import torch

from . import attention
from .linear import BlockLinear, PackedLinear
from .model_facts import PREPARED, is_prepared

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# transformers' SDPA path expands grouped K/V heads to all query heads (a copy of the whole KV
# cache, every layer) whenever an attention mask is passed, i.e. for every verify block of 2+
# rows, while a 1-row decode step passes none and uses SDPA's own GQA. On the CPU, SDPA with
# enable_gqa and a mask gives the same numbers without the copy: measured at 8K context, a 3-row
# verify block cost 1.8 target steps with the copy (docs/sweep.md). The switch is transformers'
# own, read at every attention call; it stays off for CUDA, where a mask with GQA would leave the
# fast kernels.
GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"


def prepare(model: PreTrainedModel, float32_logits: bool = True) -> PreTrainedModel:
    """Repack `model` in place (see the module docstring) and return it; a model already
    prepared is returned as it is (so a model first run as a draft keeps its logits' dtype).
    Linear layers that are not plain `torch.nn.Linear` (int8 ones, say) are left alone."""
    if is_prepared(model):
        return model
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child is not head:
                setattr(parent, name, PackedLinear(child))
    if float32_logits:
        _float32_final_norm(model)
    if type(head) is torch.nn.Linear:
        model.set_output_embeddings(PackedLinear(head, torch.float32 if float32_logits else None))
    attention.register()
    model.config._attn_implementation = attention.NAME
    setattr(model, PREPARED, {"float32_logits": float32_logits})
    return model


def block_invariant(model: PreTrainedModel) -> bool:
    """Whether every linear layer of a prepared model keeps a row's bits in any block (its
    probe found a block size from which on they agree) and none is left unpacked."""
    layers = [m for m in model.modules() if isinstance(m, (BlockLinear, torch.nn.Linear))]
    return all(isinstance(m, BlockLinear) and m.min_rows is not None for m in layers)


class _Float32Output(torch.nn.Module):
    """A norm computed in float32 on a float32 copy of its weights, output left in float32."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.norm = copy.deepcopy(norm).float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden.float())


def _float32_final_norm(model: PreTrainedModel) -> None:
    decoder = model.get_decoder()
    norm = getattr(decoder, "norm", None)
    if isinstance(norm, torch.nn.Module) and not isinstance(norm, _Float32Output):
        decoder.norm = _Float32Output(norm)

def prefer_gqa_attention(model: PreTrainedModel) -> None:
    """Turn on SDPA's own GQA for masked attention when `model` runs on the CPU (see GQA_SWITCH);
    a user's explicit setting of the variable wins."""
    if model.device.type == "cpu":
        os.environ.setdefault(GQA_SWITCH, "1")
