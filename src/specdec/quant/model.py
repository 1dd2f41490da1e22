"""A model's linear layers as weight-only int8 or int4 (specdec.forward.linear's kernels).

From a GGUF file, Q4_K and Q4_1 tensors keep their own 4-bit codes, scales and mins (exact); tensors of
other types (Q6_K, Q8_0, Q5_0 ...) are dequantized exactly and rounded to int8 per row, because
4 bits would lose what their extra bits hold (docs/quantized.md measures the choice). From dense
weights (a Hugging Face folder) every layer is rounded: int4 per group, int8 per row. A layer
whose shape a kernel cannot take stays dense. The output layer computes in float32 (logits).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from ..errors import SpecdecError
from ..forward.linear import Int4Linear, Int8Linear, fits_int4, fits_int8
from . import MODES
from .gguf_source import linear_weights, matching
from .weights import INT4_GROUPS, Int4Weight, Int8Weight, int4_rtn, int8_rtn

# The attribute a quantized model carries: what it was quantized to and from.
QUANTIZED = "specdec_quantized"
FORMAT = 1  # version of the saved layout below

Quantized = dict[str, Int4Weight | Int8Weight]


def quantize_weights(model: PreTrainedModel, mode: str, gguf: Path | None = None, group: int = 32) -> Quantized:
    """The quantized weight of each plain linear layer of `model` (module name -> weight);
    layers left out stay dense."""
    if mode not in MODES[1:]:
        raise SpecdecError(f"unknown quantization {mode!r}; use one of: {', '.join(MODES)}")
    if group not in INT4_GROUPS:
        raise SpecdecError(f"the int4 group size must be one of {INT4_GROUPS}, got {group}")
    layers = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    source: dict[str, Int4Weight | torch.Tensor] = {}
    if gguf is not None:
        heads = _rotary_heads(model)
        for name, _, weight in tqdm(linear_weights(gguf), total=len(layers), desc="reading GGUF", unit="layer"):
            if name in layers:
                source[name] = matching(name, weight, layers[name].weight.detach(), heads.get(name))
    out: Quantized = {}
    for name, layer in tqdm(layers.items(), desc=f"quantizing to {mode}", unit="layer", disable=len(layers) < 50):
        weight = source.get(name, layer.weight.detach())
        rows, inputs = layer.out_features, layer.in_features
        if mode == "int4" and isinstance(weight, Int4Weight) and fits_int4(inputs, rows, weight.group):
            out[name] = weight  # exact, whatever `group` asks of rounded layers
        elif mode == "int4" and gguf is None and fits_int4(inputs, rows, group):
            out[name] = int4_rtn(weight, group)
        elif fits_int8(inputs):
            out[name] = int8_rtn(weight.dequantize() if isinstance(weight, Int4Weight) else weight)
    return out


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The activation dtype the int4/int8 kernels run in for a model in `dtype`: a float32 model's
    quantized layers compute in bfloat16, because torch 2.13's weight-only CPU kernels have no
    fast float32 path (measured on an AVX2 CPU, one 1536 x 8960 layer, 1 row: int4 58 ms in
    float32 against 17 in bf16, int8 36 against 11; docs/quant.md)."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


def install(model: PreTrainedModel, weights: Quantized, description: dict) -> PreTrainedModel:
    """Replace `model`'s linear layers named in `weights` by int4/int8 ones, in place. They compute
    in kernel_dtype(model.dtype) and hand back the model's dtype (the output layer: float32)."""
    head = model.get_output_embeddings()
    compute = kernel_dtype(model.dtype)
    for name, weight in weights.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, child)
        kind = Int4Linear if isinstance(weight, Int4Weight) else Int8Linear
        quantized = kind(weight, layer.bias, compute)
        quantized.out_dtype = torch.float32 if layer is head else model.dtype
        setattr(parent, child, quantized)
    setattr(model, QUANTIZED, {**description, "kernel_dtype": str(compute).removeprefix("torch.")})
    return model


def save(weights: Quantized, path: Path, description: dict) -> None:
    """Write `weights` to one safetensors file (4-bit codes two to a byte)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if isinstance(w, Int4Weight):
            codes = w.codes.to(torch.uint8)
            tensors |= {f"{name}.int4_codes": codes[:, 0::2] | (codes[:, 1::2] << 4),
                        f"{name}.int4_scales": w.scales.contiguous(), f"{name}.int4_zeros": w.zeros.contiguous(),
                        f"{name}.int4_group": torch.tensor(w.group)}
        else:
            tensors |= {f"{name}.int8_codes": w.codes.contiguous(), f"{name}.int8_scales": w.scales.contiguous()}
    save_file(tensors, str(path), metadata={"format": str(FORMAT), "description": json.dumps(description)})


def load(path: Path) -> Quantized:
    tensors = load_file(str(path))
    out: Quantized = {}
    for key in tensors:
        name, _, field = key.rpartition(".")
        if field == "int4_codes":
            packed = tensors[key]
            codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
            out[name] = Int4Weight(codes, tensors[f"{name}.int4_scales"], tensors[f"{name}.int4_zeros"],
                                   int(tensors[f"{name}.int4_group"]))
        elif field == "int8_codes":
            out[name] = Int8Weight(tensors[key], tensors[f"{name}.int8_scales"])
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
