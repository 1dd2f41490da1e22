"""The native runtime's weights as the decoder reads them, in one safetensors file of the model
cache: every layer already packed (kernels.Packed, q/k/v and gate/up stacked), norms and biases,
the embedding table in its own blocks, and the output layer's unpacked form (a restricted draft
head is cut from it at load). Loading maps the file: every tensor is a view of the mapping, with
nothing copied or repacked, so a start costs the pages a forward touches, shared with every other
process that maps the same file."""

from __future__ import annotations

import dataclasses
import json
import mmap
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ...decoder_config import DecoderConfig
from ...errors import SpecdecError
from ...kernels import Packed
from ...quant.weights import Q4Weight, Q8Weight, tensor_fields
from .decoder_weights import DecoderWeights, LayerWeights, Linear, head_weights

_LINEARS = ("qkv", "o", "gate_up", "down")
_NORMS = ("attn_norm", "mlp_norm", "q_norm", "k_norm")
_DTYPES = {"F32": torch.float32, "U8": torch.uint8, "I8": torch.int8, "I32": torch.int32, "I64": torch.int64,
           "F16": torch.float16, "BF16": torch.bfloat16}


def save_weights(weights: DecoderWeights, head: Q4Weight | Q8Weight, path: Path) -> None:
    """`weights` (with its full head) and the head's unpacked form in one file at `path`."""
    save_layers(iter(weights.layers), lambda: (weights, head), path)


def save_layers(layers: Iterator[LayerWeights], outside: Callable[[], tuple[DecoderWeights, Q4Weight | Q8Weight]],
                path: Path) -> None:
    """What save_weights writes, each layer written as `layers` yields it and dropped before the
    next is made, then `outside()`: the weights with the embedding, final norm and head (its
    `layers` unread) and the head's unpacked form. A conversion then holds one layer, never the
    whole packed model (1.2 GB for the 1.5B target) beside the GGUF it reads."""
    with _Writer(path) as writer:
        entries = [_put_layer(writer, i, layer) for i, layer in enumerate(layers)]
        weights, head = outside()
        layout: dict = {"layers": entries, "mode": weights.mode, "origin": weights.origin, "forms": weights.forms}
        writer.add("final_norm", weights.final_norm)
        layout["head"] = _put_linear(writer, "head", weights.head)
        layout["embedding"] = _put_table(writer, "embedding", weights.embedding)
        tied = head is weights.embedding
        layout["head_source"] = "embedding" if tied else _put_table(writer, "head_source", head)
        writer.finish({"layout": json.dumps(layout)})


def _put_layer(writer: _Writer, i: int, layer: LayerWeights) -> dict:
    entry = {name: _put_linear(writer, f"layers.{i}.{name}", getattr(layer, name)) for name in _LINEARS}
    for name in _NORMS:
        if getattr(layer, name) is not None:
            writer.add(f"layers.{i}.{name}", getattr(layer, name))
    return entry


def load_weights(path: Path, cfg: DecoderConfig, head_ids: torch.Tensor | None) -> DecoderWeights:
    """What save_weights wrote, mapped (see the module docstring); `head_ids` cuts the head."""
    tensors, layout = _mapped(path)
    layers = []
    for i, entry in enumerate(layout["layers"]):
        linears = {name: _get_linear(tensors, f"layers.{i}.{name}", entry[name]) for name in _LINEARS}
        norms = {name: tensors.get(f"layers.{i}.{name}") for name in _NORMS}
        layers.append(LayerWeights(**linears, **norms))
    embedding = _get_table(tensors, "embedding", layout["embedding"])
    head = _get_linear(tensors, "head", layout["head"])
    head_source = embedding if layout["head_source"] == "embedding" else _get_table(tensors, "head_source",
                                                                                     layout["head_source"])
    head, head_ids, rows = head_weights(head, head_source, head_ids)
    return DecoderWeights(cfg, embedding, layers, tensors["final_norm"], head, head_ids, rows, layout["forms"],
                          layout["mode"], layout["origin"])


_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class _Writer:
    """A safetensors file written a tensor at a time (safetensors' own writer first copies every
    tensor into bytes: another gigabyte for the 1.5B model); _mapped reads it back. The header,
    which comes first, is known only at the end: the data goes to a file beside `path` and is
    copied behind the header by finish(); a writer left unfinished removes both."""

    def __init__(self, path: Path) -> None:
        self.path, self.data_path = path, path.with_name(path.name + ".data")
        self.entries: dict[str, dict] = {}
        self.offset = 0
        self.data = open(self.data_path, "wb")

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, kind, *_) -> None:
        self.data.close()
        self.data_path.unlink(missing_ok=True)
        if kind is not None:
            self.path.unlink(missing_ok=True)

    def add(self, name: str, t: torch.Tensor) -> None:
        if name in self.entries:
            raise ValueError(f"tensor {name} written twice")
        size = t.numel() * t.element_size()
        self.entries[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                              "data_offsets": [self.offset, self.offset + size]}
        self.offset += size
        if size:
            self.data.write(memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()))

    def finish(self, metadata: dict[str, str]) -> None:
        """The header, then the data written so far."""
        self.data.close()
        text = json.dumps({"__metadata__": metadata, **self.entries}).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        with open(self.path, "wb") as f, open(self.data_path, "rb") as data:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            shutil.copyfileobj(data, f, _COPY_BYTES)


_COPY_BYTES = 1 << 24  # the buffer copying the data behind the header


def _put_linear(writer: _Writer, at: str, linear: Linear) -> list[dict]:
    parts = []
    for j, (packed, bias) in enumerate(zip(linear.parts, linear.biases)):
        for field in ("codes", "subs", "supers"):
            writer.add(f"{at}.{j}.{field}", getattr(packed, field))
        if bias is not None:
            writer.add(f"{at}.{j}.bias", bias)
        parts.append({"bits": packed.bits, "per_super": packed.per_super, "zero": packed.zero, "bias": bias is not None})
    return parts


def _get_linear(tensors: dict, at: str, parts: list[dict]) -> Linear:
    packed = [Packed(p["bits"], *(tensors[f"{at}.{j}.{f}"] for f in ("codes", "subs", "supers")), p["per_super"],
                     p["zero"]) for j, p in enumerate(parts)]
    return Linear(packed, [tensors[f"{at}.{j}.bias"] if p["bias"] else None for j, p in enumerate(parts)])


def _put_table(writer: _Writer, at: str, table: Q4Weight | Q8Weight | torch.Tensor) -> dict:
    if isinstance(table, torch.Tensor):
        writer.add(at, table)
        return {"kind": "dense"}
    fields = tensor_fields(table)
    for f in fields:
        writer.add(f"{at}.{f}", getattr(table, f))
    plain = {f.name: getattr(table, f.name) for f in dataclasses.fields(table) if f.name not in fields}
    return {"kind": type(table).__name__, "plain": plain}


def _get_table(tensors: dict, at: str, entry: dict) -> Q4Weight | Q8Weight | torch.Tensor:
    if entry["kind"] == "dense":
        return tensors[at]
    cls = {"Q4Weight": Q4Weight, "Q8Weight": Q8Weight}[entry["kind"]]
    fields = {f.name for f in dataclasses.fields(cls)} - set(entry["plain"])
    return cls(**{f: tensors[f"{at}.{f}"] for f in fields}, **entry["plain"])


def _mapped(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of a safetensors file as views of one private mapping of it (safetensors' own
    torch loader reads every tensor into memory), and its layout metadata."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
    except (OSError, ValueError) as e:
        raise SpecdecError(f"cannot read the cached weights {path} ({e}); delete that folder and they are made "
                           "again") from None
    base = 8 + size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // dtype.itemsize
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=base + start) if count else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors, json.loads(header["__metadata__"]["layout"])
