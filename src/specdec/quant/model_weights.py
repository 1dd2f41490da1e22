"""The Q4 ("int4") or Q8 ("int8") weight of each plain linear layer of a transformers model, from
its dense weights or, where a GGUF file holds the layer, from the file's own blocks (see
models.quantized, which installs them, and runtime.native, which packs them). Reads the model's
modules only: no transformers import."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from ..errors import SpecdecError
from . import MODES
from .gguf_source import Decoded, linear_weights, matching
from .weights import INT4_GROUPS, Q4Weight, Q8Weight, fits, q4_rtn, q8_rtn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Quantized = dict[str, Q4Weight | Q8Weight]


def quantize_weights(model: PreTrainedModel, mode: str, gguf: Path | None = None, group: int = 32) -> Quantized:
    """The quantized weight of each plain linear layer of `model` (module name -> weight);
    layers left out stay dense."""
    if mode not in MODES[1:]:
        raise SpecdecError(f"unknown quantization {mode!r}; use one of: {', '.join(MODES)}")
    if group not in INT4_GROUPS:
        raise SpecdecError(f"the int4 group size must be one of {INT4_GROUPS}, got {group}")
    layers = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    source: dict[str, Decoded] = {}
    if gguf is not None:
        heads = _rotary_heads(model)
        for name, _, weight in tqdm(linear_weights(gguf), total=len(layers), desc="reading GGUF", unit="layer"):
            if name in layers:
                source[name] = matching(name, weight, layers[name].weight.detach(), heads.get(name))
    out: Quantized = {}
    for name, layer in tqdm(layers.items(), desc=f"quantizing to {mode}", unit="layer", disable=len(layers) < 50):
        if not fits(layer.in_features, layer.out_features):
            continue
        weight = source.get(name, layer.weight.detach())
        if isinstance(weight, Q8Weight) or (isinstance(weight, Q4Weight) and mode == "int4"):
            out[name] = weight  # exact, whatever `group` asks of rounded layers
        elif isinstance(weight, Q4Weight):
            out[name] = q8_rtn(weight.dequantize())
        elif mode == "int4" and (gguf is None or name in source) and layer.in_features % group == 0:
            out[name] = q4_rtn(weight, group)
        else:
            out[name] = q8_rtn(weight)
    return out


def _rotary_heads(model: PreTrainedModel) -> dict[str, int]:
    """Head counts of the q and k projections of a Llama model, whose GGUF rows llama.cpp
    interleaves (see gguf_source.matching); none for other architectures."""
    config = model.config
    if config.model_type != "llama":
        return {}
    heads = {}
    for name, _ in model.named_modules():
        if name.endswith("self_attn.q_proj"):
            heads[name] = config.num_attention_heads
        elif name.endswith("self_attn.k_proj"):
            heads[name] = config.num_key_value_heads
    return heads
