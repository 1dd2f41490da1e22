"""Quantized models, converted once into the model cache.

A registry model is quantized from its own GGUF file (quant.model: Q4_K and Q6_K blocks kept
exactly, other types rounded), which takes minutes for the
1.5B target (about 230 s on 2 cores), so the result is saved once as
`<cache>/<name>-int4-g32/` or `<cache>/<name>-int8/` (`weights.safetensors` and a marker) and
later loads install it in seconds. The folder is written under a temporary name and renamed
into place when complete; the marker records the source GGUF's sha256, the mode, the group and
the format version, and the weights file's size, so a folder from another source, version or a
half-written file is never used (it is converted again). The cached weights are a function of
(model, mode, group) alone: they are made from a freshly loaded dense copy of the model, not
from the model in hand (whose output layer may be restricted, specdec.models.draft_head).

A local Hugging Face folder is quantized from its dense weights by rounding (int8 per output
row, int4 per group) at every load: that takes seconds, and hashing its weights to key a cache
would cost about as much.
"""

from __future__ import annotations

import sys

import torch
from transformers import PreTrainedModel

from ..errors import SpecdecError
from ..files import cache_root, cached
from ..runtime.hf.model_facts import PREPARED_FIX, is_prepared
from ..quant.weights import INT4_GROUPS, fits, q8_rtn
from .quant_options import GGUF_GROUP, describe
from ..quant.model_weights import Quantized, quantize_weights
from .quantized import FORMAT, install, load, save
from ..registry import REGISTRY, ModelSpec, converted_folder, gguf_file



def quantize_model(model: PreTrainedModel, source: str | None, mode: str, group: int = 32,
                   weights: Quantized | None = None) -> PreTrainedModel:
    """`model` (loaded from `source`: a registry name or a folder, None: rounded; unprepared)
    with its linear layers replaced by `mode` ones, in place; "none" returns it as it is.
    `weights`: a registry model's registry_weights, where the caller fetched them already. The
    options are the caller's to check first (check_options: before anything slow runs)."""
    if mode == "none":
        return model
    if is_prepared(model):
        raise SpecdecError(f"this model {PREPARED_FIX}")
    spec = REGISTRY.get(source)
    if spec is None:
        hidden = getattr(model.config, "hidden_size", None)
        if mode == "int4" and hidden and hidden % group:
            raise SpecdecError(f"int4 groups of {group} do not divide the model's hidden size {hidden}; "
                               f"pick --quant-group from {', '.join(map(str, INT4_GROUPS))} that does")
        print(f"specdec: rounding {source or 'the model'} to {describe(mode, group)} (a folder: done at every load, seconds)",
              file=sys.stderr)
        weights = quantize_weights(model, mode, None, group)
    else:
        weights = weights or registry_weights(spec, mode)
    return install(model, _fitted(model, weights))


def registry_weights(spec: ModelSpec, mode: str) -> Quantized:
    """The cached quantized weights of a registry model, converted first if missing."""
    group = GGUF_GROUP if mode == "int4" else None
    key = {"name": spec.name, "mode": mode, "group": group, "source_sha256": spec.sha256, "format": FORMAT}
    folder = cache_root() / f"{spec.name}-{describe(mode, GGUF_GROUP)}"

    def convert() -> Quantized:
        print(f"specdec: quantizing {spec.name} to {describe(mode, GGUF_GROUP)} from its GGUF "
              "(minutes for the 1.5B model, once) ...", file=sys.stderr)
        from transformers import AutoModelForCausalLM

        dense = AutoModelForCausalLM.from_pretrained(converted_folder(spec), dtype=torch.bfloat16,
                                                     use_safetensors=True, local_files_only=True)
        return quantize_weights(dense, mode, gguf_file(spec.name), GGUF_GROUP)

    return cached(folder, key, convert, save, load)


def _fitted(model: PreTrainedModel, weights: Quantized) -> Quantized:
    """`weights` for the layers of `model` they fit; a plain linear layer whose shape differs
    from its cached weight (a draft's output layer cut to frequent ids) is rounded to int8 from
    its own weight instead (Q8)."""
    out: Quantized = {}
    for name, layer in model.named_modules():
        if type(layer) is not torch.nn.Linear or name not in weights:
            continue
        weight = weights[name]
        if tuple(weight.codes.shape) == tuple(layer.weight.shape):
            out[name] = weight
        elif fits(layer.in_features, layer.out_features):
            out[name] = q8_rtn(layer.weight.detach())
    return out
