"""A model's linear layers as Q4 ("int4") or Q8 ("int8") weights on specdec's kernels
(quant.weights, specdec.kernels).

From a GGUF file, Q4_K, Q4_1 and Q6_K tensors keep their own codes and scales exactly (Q4_K and
Q4_1 as Q4 for int4, Q6_K as Q8 in either mode: 4 bits would lose what its extra bits hold,
docs/quant.md); a tensor of another type is rounded to what the mode asks, Q4 for int4 (the
Q5_0 / Q8_0 layers llama.cpp gives shapes Q4_K cannot take, as the 0.5B draft's 896-wide ones)
and Q8 for int8. A layer with no tensor of its own in the file (a tied output layer) is rounded
to Q8. From dense weights (a Hugging Face folder) every layer is rounded: Q4 per group for
int4, Q8 for int8. A layer whose shape the kernels cannot take stays dense. The output layer
computes in float32 (logits).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from ..quant.model_weights import Quantized
from ..quant.weights import Q4Weight, Q8Weight, stacked
from ..runtime.hf.linear import QuantLinear, SharedInputPart

FORMAT = 2  # version of the saved layout below (1: torch's int4/int8 kernel layouts)

# Layers that one module feeds the same input, computed as one (runtime.hf.linear.SharedInputPart).
_SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def install(model: PreTrainedModel, weights: Quantized) -> PreTrainedModel:
    """Replace `model`'s linear layers named in `weights` by quantized ones, in place. They read
    and hand back the model's dtype (the output layer: float32). Layers fed the same input whose
    weights have one form run as one kernel call (_SHARED_INPUT)."""
    head = model.get_output_embeddings()
    shared = _shared_groups(model, weights)
    for group, weight in shared:
        layers = [model.get_submodule(name) for name in group]
        bias = None if layers[0].bias is None else torch.cat([layer.bias.detach() for layer in layers])
        layer = QuantLinear(weight, bias, model.dtype)
        start = 0
        for i, (name, part) in enumerate(zip(group, layers)):
            model.set_submodule(name, SharedInputPart(layer, start, start + part.out_features, i == 0, len(group)))
            start += part.out_features
    done = {name for group, _ in shared for name in group}
    for name, weight in weights.items():
        if name in done:
            continue
        layer = model.get_submodule(name)
        quantized = QuantLinear(weight, layer.bias, model.dtype)
        quantized.out_dtype = torch.float32 if layer is head else None
        model.set_submodule(name, quantized)
    return model


def _shared_groups(model: PreTrainedModel, weights: Quantized) -> list[tuple[list[str], Q4Weight | Q8Weight]]:
    """(layer names, stacked weight) for each set of _SHARED_INPUT layers of one module that are
    all in `weights`, in one form, and all with or all without a bias."""
    out = []
    for parent, module in model.named_modules():
        for children in _SHARED_INPUT:
            names = [f"{parent}.{child}" if parent else child for child in children]
            if not all(name in weights for name in names):
                continue
            if len({getattr(module, child).bias is None for child in children}) > 1:
                continue
            weight = stacked([weights[name] for name in names])
            if weight is not None:
                out.append((names, weight))
    return out


def to_tensors(weights: Quantized) -> dict[str, torch.Tensor]:
    """`weights` as named tensors for a safetensors file (codes of up to 4 bits two to a byte,
    5-bit codes a byte each)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if isinstance(w, Q4Weight):
            codes = w.codes if w.bits > 4 else w.codes[:, 0::2] | (w.codes[:, 1::2] << 4)
            tensors |= {f"{name}.q4_codes": codes,
                        f"{name}.q4_sub_scales": w.sub_scales, f"{name}.q4_sub_mins": w.sub_mins,
                        f"{name}.q4_scales": w.scales, f"{name}.q4_mins": w.mins,
                        f"{name}.q4_per_super": torch.tensor(w.per_super), f"{name}.q4_bits": torch.tensor(w.bits)}
        else:
            tensors |= {f"{name}.q8_codes": w.codes, f"{name}.q8_sub_scales": w.sub_scales,
                        f"{name}.q8_scales": w.scales, f"{name}.q8_zero": torch.tensor(w.zero),
                        f"{name}.q8_per_super": torch.tensor(w.per_super)}
    return {k: v.contiguous() for k, v in tensors.items()}


def from_tensors(tensors: dict[str, torch.Tensor]) -> Quantized:
    """The weights to_tensors wrote; other tensors in the file are left alone."""
    out: Quantized = {}
    for key in tensors:
        name, _, field = key.rpartition(".")
        get = lambda suffix: tensors[f"{name}.{suffix}"]
        if field == "q4_codes":
            packed = tensors[key]
            bits = int(tensors.get(f"{name}.q4_bits", torch.tensor(4)))  # files of before Q3 lack it
            codes = packed if bits > 4 else torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
            out[name] = Q4Weight(codes, get("q4_sub_scales"), get("q4_sub_mins"), get("q4_scales"), get("q4_mins"),
                                 int(get("q4_per_super")), bits)
        elif field == "q8_codes":
            per_super = int(tensors.get(f"{name}.q8_per_super", torch.tensor(16)))  # files of before Q8_0 lack it
            out[name] = Q8Weight(tensors[key], get("q8_sub_scales"), get("q8_scales"), int(get("q8_zero")), per_super)
    return out


def save(weights: Quantized, path: Path, description: dict) -> None:
    """Write `weights` to one safetensors file."""
    save_file(to_tensors(weights), str(path), metadata={"format": str(FORMAT), "description": json.dumps(description)})


def load(path: Path) -> Quantized:
    return from_tensors(load_file(str(path)))
