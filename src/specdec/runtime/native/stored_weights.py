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
    tensors: dict[str, torch.Tensor] = {}
    layout: dict = {"layers": [], "mode": weights.mode, "origin": weights.origin, "forms": weights.forms}
    for i, layer in enumerate(weights.layers):
        entry = {}
        for name in _LINEARS:
            entry[name] = _put_linear(tensors, f"layers.{i}.{name}", getattr(layer, name))
        for name in _NORMS:
            if getattr(layer, name) is not None:
                tensors[f"layers.{i}.{name}"] = getattr(layer, name)
        layout["layers"].append(entry)
    tensors["final_norm"] = weights.final_norm
    layout["head"] = _put_linear(tensors, "head", weights.head)
    layout["embedding"] = _put_table(tensors, "embedding", weights.embedding)
    tied = head is weights.embedding
    layout["head_source"] = "embedding" if tied else _put_table(tensors, "head_source", head)
    _write(tensors, path, {"layout": json.dumps(layout)})


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


def _write(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """A safetensors file written a tensor at a time (safetensors' own writer first copies every
    tensor into bytes: another gigabyte for the 1.5B model); _mapped reads it back."""
    header, offset = {"__metadata__": metadata}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for t in tensors.values():
            if t.numel():
                f.write(memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()))


def _put_linear(tensors: dict, at: str, linear: Linear) -> list[dict]:
    parts = []
    for j, (packed, bias) in enumerate(zip(linear.parts, linear.biases)):
        for field in ("codes", "subs", "supers"):
            tensors[f"{at}.{j}.{field}"] = getattr(packed, field)
        if bias is not None:
            tensors[f"{at}.{j}.bias"] = bias
        parts.append({"bits": packed.bits, "per_super": packed.per_super, "zero": packed.zero, "bias": bias is not None})
    return parts


def _get_linear(tensors: dict, at: str, parts: list[dict]) -> Linear:
    packed = [Packed(p["bits"], *(tensors[f"{at}.{j}.{f}"] for f in ("codes", "subs", "supers")), p["per_super"],
                     p["zero"]) for j, p in enumerate(parts)]
    return Linear(packed, [tensors[f"{at}.{j}.bias"] if p["bias"] else None for j, p in enumerate(parts)])


def _put_table(tensors: dict, at: str, table: Q4Weight | Q8Weight | torch.Tensor) -> dict:
    if isinstance(table, torch.Tensor):
        tensors[at] = table
        return {"kind": "dense"}
    fields = tensor_fields(table)
    tensors |= {f"{at}.{f}": getattr(table, f) for f in fields}
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
