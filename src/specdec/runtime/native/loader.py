"""Loading a model onto the native runtime: a GGUF file (a registry name resolves to its own),
read whole from the file (shapes, end ids and tokenizer from its metadata, specdec.gguf; weights
in their own blocks, weight_source) and kept once in the model cache; or a dense transformers
model rounded (tests, local folders)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...decoder_config import DecoderConfig, decoder_config
from ...errors import SpecdecError
from ...quant.heap import return_freed_memory
from . import NATIVE_MODES
from .decoder import Decoder
from .decoder_weights import DecoderWeights, LayerWeights, assemble, build, layer_weights
from .native_lm import NativeLM
from .rotary import rotary_tables
from .stored_weights import load_weights, save_layers
from .weight_source import HEAD, layer, outside_layers, read_gguf, read_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STORED_FORMAT = 4  # version of what stored_weights.save_layers writes and of read_gguf's forms
CAPACITY = 4096  # cache slots to start with (28 layers x 256 floats x 2 x 4 B = 235 MiB for the 1.5B); grown on demand


def _check_mode(mode: str) -> None:
    if mode not in NATIVE_MODES:
        raise SpecdecError(f"the native runtime runs {', '.join(NATIVE_MODES)} weights, not {mode!r}")


def _native_lm(weights: DecoderWeights, cfg: DecoderConfig, eos: tuple[int, ...], capacity: int) -> NativeLM:
    return NativeLM(Decoder(weights, lambda slots: rotary_tables(cfg, slots), capacity), eos, cfg.max_positions)


def load_gguf(name_or_path: str, mode: str = "int4", capacity: int = CAPACITY,
              head_ids: torch.Tensor | None = None) -> NativeLM:
    """The model of a GGUF file (or a registry name's) in `mode`: "int4", the file as it is (every
    common block type kept exactly, weight_source); "int8": its Q4/Q5 blocks rounded to Q8;
    "int3", a draft's form: every layer rounded to Q3, the output layer to Q4. `head_ids`: score
    only these token ids (a restricted draft head, sorted; specdec.models.draft_head.frequent_tokens)."""
    began = time.perf_counter()
    stored, model = store_gguf(name_or_path, mode)
    lm = _native_lm(load_weights(stored, model.config, head_ids), model.config, model.eos, capacity)
    print(f"specdec: {name_or_path} on the native runtime ({mode}, {time.perf_counter() - began:.1f} s)",
          file=sys.stderr)
    return lm


def store_gguf(name_or_path: str, mode: str = "int4"):
    """The model cache's file of the GGUF's weights in `mode` (read from the GGUF the first time),
    and the model's description. Commands that load a pair store both before loading either, so
    the draft's conversion never runs beside a loaded target (a cold start peaks lower)."""
    from tqdm import tqdm

    from ...files import WEIGHTS, cached
    from ...gguf import gguf_path, prepared
    from ...gguf.metadata import open_reader, release_pages

    _check_mode(mode)
    path = gguf_path(name_or_path)
    folder, model = prepared(path)  # shapes and end ids; refuses what it cannot run before any weight

    def convert(file: Path) -> None:
        """Read, packed and written a layer at a time (stored_weights.save_layers), each layer's
        GGUF pages released after it, and the embedding and head last: holding every packed layer
        until the write, beside the GGUF's pages, peaked at 4.6 GB for the default pair."""
        print(f"specdec: reading {path.name}'s weights for the native runtime ({mode}; seconds to a minute, once)",
              file=sys.stderr)
        reader = open_reader(path)
        forms: dict[str, str] = {}

        def layers() -> Iterator[LayerWeights]:
            for i in tqdm(range(model.config.layers), desc=f"reading {path.name}", unit="layer", leave=False):
                part = read_gguf(reader, model.config, mode, layer(i))
                forms.update(part.forms)
                release_pages(reader)
                yield layer_weights(part, i)
                return_freed_memory()  # each layer's temporaries: the heap grew 0.4 GB over the draft's 24 without

        def outside() -> tuple[DecoderWeights, object]:
            rest = read_gguf(reader, model.config, mode, outside_layers)
            release_pages(reader)
            rest.forms.update(forms)  # the embedding's and head's forms first, as the file always listed them
            return assemble(model.config, [], rest, mode), rest.linears[HEAD]

        save_layers(layers(), outside, file)

    store = folder / f"native-{mode}"
    made = []
    cached(store, {"mode": mode, "format": STORED_FORMAT}, lambda: made.append(1) or convert,
           lambda write, file, _: write(file), lambda file: None)
    if made:  # a cold start would otherwise carry the conversion's freed heap beside the models it loads
        return_freed_memory()
    return store / WEIGHTS, model


def gguf_model(name_or_path: str, quant: str = "int4", capacity: int = CAPACITY):
    """A GGUF file's model on the native runtime (load_gguf) and its tokenizer: the library's
    loader of GGUF files (specdec.load_gguf), as specdec.load_model is of Hugging Face folders."""
    from ...gguf import tokenizer_of

    return load_gguf(name_or_path, quant, capacity), tokenizer_of(name_or_path)


def from_transformers(model: PreTrainedModel, mode: str = "int4", capacity: int = CAPACITY,
                      head_ids: torch.Tensor | None = None) -> NativeLM:
    """A dense transformers model on the native runtime, every linear layer rounded (int4: Q4
    in groups of 32, int3: Q3; the output layer Q8, int3's Q4)."""
    _check_mode(mode)
    from ..hf.model_facts import eos_token_ids

    cfg = decoder_config(model.config)
    return _native_lm(build(cfg, read_model(model, cfg, mode), mode, head_ids), cfg, eos_token_ids(model), capacity)

