"""The loaded model as the native decoder reads it: every linear layer packed for the kernels
(q/k/v and gate/up stacked into one weight where their forms agree), the rest float32."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ...decoder_config import DecoderConfig
from ...errors import SpecdecError
from ...kernels import Packed, pack
from ...quant.weights import Q4Weight, Q8Weight, stacked, tensor_fields
from .weight_source import EMBEDDING, EMBEDDING_TABLE, HEAD, SourceWeights


@dataclass
class Linear:
    """Layers fed one input, as one or more packed weights whose outputs lie side by side."""

    parts: list[Packed]
    biases: list[torch.Tensor | None]


@dataclass
class LayerWeights:
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q_norm: torch.Tensor | None = None  # per-head norms of q and k (Qwen3)
    k_norm: torch.Tensor | None = None


@dataclass
class DecoderWeights:
    """What was loaded, in which forms (`forms`: module name -> e.g. "Q4 = Q4_K (exact)")."""

    config: DecoderConfig
    embedding: Q4Weight | Q8Weight | torch.Tensor  # [vocab, hidden]: a GGUF's own blocks, or float32
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    head: Linear
    head_ids: torch.Tensor | None  # sorted token ids the head scores (a restricted draft head), None: all
    head_rows: int  # rows the head scores (its packed weight may carry padding rows beyond)
    forms: dict[str, str]
    mode: str
    origin: str

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding rows of `tokens`, float32 [n, hidden] (a quantized table decodes just
        these rows: the whole of it in float32 is 0.9 GB for a 151,936-token, 1536-wide model)."""
        if isinstance(self.embedding, torch.Tensor):
            return self.embedding[tokens]
        table = self.embedding
        return dataclasses.replace(table, **{f: getattr(table, f)[tokens] for f in tensor_fields(table)}).dequantize()

    def nbytes(self) -> int:
        """Bytes of weights a forward reads: packed layers with their biases, norms; of the
        embedding only a row per token, not counted."""
        linears = [*(x for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)), self.head]
        norms = [self.final_norm, *(n for layer in self.layers
                                    for n in (layer.attn_norm, layer.mlp_norm, layer.q_norm, layer.k_norm) if n is not None)]
        tensors = [*norms, *(b for x in linears for b in x.biases if b is not None)]
        return sum(p.nbytes() for x in linears for p in x.parts) + sum(t.numel() * t.element_size() for t in tensors)


def _linear(weights: list[Q4Weight | Q8Weight], biases: list[torch.Tensor | None]) -> Linear:
    """One packed weight where the forms agree (one kernel call), else one per layer."""
    joined = stacked(weights) if len(weights) > 1 else weights[0]
    if joined is not None:
        bias = None if biases[0] is None else torch.cat(biases).float().contiguous()
        return Linear([pack(joined)], [bias])
    return Linear([pack(w) for w in weights], [None if b is None else b.float().contiguous() for b in biases])


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _head_rows(weight: Q4Weight | Q8Weight, ids: torch.Tensor) -> Q4Weight | Q8Weight:
    """The rows of `ids`, padded to a whole tile of 16 with copies of the last (scored, then
    dropped)."""
    padded = torch.cat([ids, ids[-1:].expand(-ids.numel() % 16)])
    return dataclasses.replace(weight, **{f: getattr(weight, f)[padded] for f in tensor_fields(weight)})


def build(cfg: DecoderConfig, source: SourceWeights, mode: str, head_ids: torch.Tensor | None = None
          ) -> DecoderWeights:
    layers = [layer_weights(source, i) for i in range(cfg.layers)]
    return assemble(cfg, layers, source, mode, head_ids)


def layer_weights(source: SourceWeights, i: int) -> LayerWeights:
    """Layer i of `source` packed for the decoder."""
    lin, dense = source.linears, source.dense
    at = f"model.layers.{i}."
    qkv = [f"{at}self_attn.{p}_proj" for p in "qkv"]
    return LayerWeights(
        _linear([lin[n] for n in qkv], [dense.get(n + ".bias") for n in qkv]),
        _linear([lin[at + "self_attn.o_proj"]], [None]),
        _linear([lin[at + "mlp.gate_proj"], lin[at + "mlp.up_proj"]], [None, None]),
        _linear([lin[at + "mlp.down_proj"]], [None]),
        dense[at + "input_layernorm.weight"].contiguous(), dense[at + "post_attention_layernorm.weight"].contiguous(),
        *(_contiguous(dense.get(f"{at}self_attn.{p}_norm.weight")) for p in "qk"),
    )


def assemble(cfg: DecoderConfig, layers: list[LayerWeights], outside: SourceWeights, mode: str,
             head_ids: torch.Tensor | None = None) -> DecoderWeights:
    """The decoder's weights: `layers` and, from `outside`, the embedding, final norm and head."""
    lin, dense = outside.linears, outside.dense
    embedding = lin[EMBEDDING_TABLE] if EMBEDDING_TABLE in lin else dense[EMBEDDING].contiguous()
    head, head_ids, rows = head_weights(None, lin[HEAD], head_ids)
    return DecoderWeights(cfg, embedding, layers, dense["model.norm.weight"].contiguous(), head, head_ids, rows,
                          outside.forms, mode, outside.origin)


def head_weights(packed: Linear | None, source: Q4Weight | Q8Weight, head_ids: torch.Tensor | None
                 ) -> tuple[Linear, torch.Tensor | None, int]:
    """The output layer (`packed`, the whole of `source` packed, where given), or, with
    `head_ids`, the rows of those ids cut from `source`; with the sorted ids and the row count."""
    rows = source.codes.shape[0]
    if head_ids is None:
        return packed or _linear([source], [None]), None, rows
    head_ids = torch.unique(head_ids.long())
    if head_ids.numel() == 0 or int(head_ids[0]) < 0 or int(head_ids[-1]) >= rows:
        raise SpecdecError(f"head token ids must lie in [0, {rows}) and not be empty")
    return _linear([_head_rows(source, head_ids)], [None]), head_ids, head_ids.numel()
