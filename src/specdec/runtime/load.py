"""Loading a model onto the native runtime: a registry model straight from its GGUF (config,
tokenizer and generation config from its converted Hugging Face folder), or a dense
transformers model rounded (tests, local folders)."""

from __future__ import annotations

import sys
import time
from functools import partial

import torch
from transformers import AutoConfig, GenerationConfig, PreTrainedModel

from ..errors import SpecdecError
from ..models.load import token_ids
from .choose import NATIVE_MODES
from .config import decoder_config, rotary_tables
from .lm import NativeLM
from .native import Decoder
from .source import SourceWeights, load_source, read_gguf, read_model, save_source
from .weights import build

SOURCE_FORMAT = 1  # version of what save_source writes and of read_gguf's forms
CAPACITY = 4096  # cache slots to start with (28 layers x 256 floats x 2 x 4 B = 235 MiB for the 1.5B); grown on demand


def _check_mode(mode: str) -> None:
    if mode not in NATIVE_MODES:
        raise SpecdecError(f"the native runtime runs {', '.join(NATIVE_MODES)} weights, not {mode!r}")


def _eos(generation_config: GenerationConfig | None) -> tuple[int, ...]:
    eos = getattr(generation_config, "eos_token_id", None)
    return () if eos is None else token_ids(eos)


def _assemble(config, source: SourceWeights, mode: str, capacity: int, head_ids: torch.Tensor | None,
              eos: tuple[int, ...]) -> NativeLM:
    cfg = decoder_config(config)
    weights = build(cfg, source, mode, head_ids)
    return NativeLM(Decoder(weights, partial(rotary_tables, config), capacity), eos, cfg.max_positions)


def load_registry(name: str, mode: str = "int4", capacity: int = CAPACITY,
                  head_ids: torch.Tensor | None = None) -> NativeLM:
    """A registry model from its GGUF in `mode` ("int4": Q4_K/Q4_1 exact, Q6_K exact as Q8,
    other types rounded; "int8": Q6_K exact, the rest rounded to Q8; "int3", a draft's form:
    every layer rounded to Q3, the output layer to Q4). `head_ids`: score only
    these token ids (a restricted draft head, sorted; specdec.models.draft_head.frequent_tokens)."""
    from ..models.registry import REGISTRY, converted_folder

    _check_mode(mode)
    if name not in REGISTRY:
        raise SpecdecError(f"unknown registry model {name!r}; the native runtime loads: {', '.join(REGISTRY)}")
    folder = converted_folder(REGISTRY[name])
    config = AutoConfig.from_pretrained(folder)
    cfg = decoder_config(config)  # refuse before reading the weights
    began = time.perf_counter()
    source = _registry_source(name, cfg, mode)
    lm = _assemble(config, source, mode, capacity, head_ids, _eos(GenerationConfig.from_pretrained(folder)))
    print(f"specdec: {name} on the native runtime ({mode}, {time.perf_counter() - began:.1f} s)", file=sys.stderr)
    return lm


def _registry_source(name: str, cfg, mode: str) -> SourceWeights:
    """The weights of a registry model in `mode`, read from its GGUF once and kept in the model
    cache as `<cache>/<name>-native-<mode>/` (keyed by the GGUF's sha256, the mode and SOURCE_FORMAT)."""
    from ..files import cache_root
    from ..models.quant_cache import cached
    from ..models.registry import REGISTRY, gguf_file

    def read() -> SourceWeights:
        print(f"specdec: reading {name} from its GGUF for the native runtime ({mode}; about a minute, once)",
              file=sys.stderr)
        return read_gguf(gguf_file(name), cfg, mode)

    key = {"name": name, "mode": mode, "source_sha256": REGISTRY[name].sha256, "format": SOURCE_FORMAT}
    return cached(cache_root() / f"{name}-native-{mode}", key, read, save_source, load_source)


def load_model(model: PreTrainedModel, mode: str = "int4", capacity: int = CAPACITY,
               head_ids: torch.Tensor | None = None) -> NativeLM:
    """A dense transformers model on the native runtime, every linear layer rounded (int4: Q4
    in groups of 32, int3: Q3; the output layer Q8, int3's Q4)."""
    _check_mode(mode)
    cfg = decoder_config(model.config)
    return _assemble(model.config, read_model(model, cfg, mode), mode, capacity, head_ids,
                     _eos(model.generation_config))

