"""A Llama-family model's weights by Hugging Face name, in the forms the native decoder runs:
linear layers as Q4/Q8 weights (quant.weights), norms, biases and the embedding as float32.

From a GGUF file (read_gguf), int4 mode is the file as it is: every block type of common files
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) kept exactly in a Q4, Q5 or Q8 form
(quant.gguf_source); a linear weight of another type (F16, F32, Q2_K, IQ...) is refused, never
rounded. int8 mode rounds the Q4/Q5 forms to Q8 (Q8 ones stay exact). A tied output layer is the
embedding tensor in these same forms.
int3 mode, a draft's form, rounds every layer from what its tensor stands for: to Q3, the output
layer to Q4 (the draft's guesses are its argmax).
From a dense model (read_model: tests, Hugging Face folders) every layer is rounded.
loader keeps what is read here, packed, in the model cache (stored_weights): reading and
splitting a GGUF's blocks takes 15-45 s where the saved file maps in a blink.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from gguf import GGUFReader, quants

from ...decoder_config import DecoderConfig
from ...errors import SpecdecError
from ...quant.gguf_source import EXACT, decode_exact, linear_weights, rows_unpermuted
from ...quant.heap import return_freed_memory
from ...quant.model_weights import Quantized, quantize_weights
from ...quant.weights import Q4Weight, Q8Weight, q3_rtn, q4_rtn, q8_rtn, stacked, tensor_fields

if TYPE_CHECKING:
    from transformers import PreTrainedModel


HEAD = "lm_head"
EMBEDDING = "model.embed_tokens.weight"  # a float32 embedding (dense models, float GGUF tensors) in `dense`
EMBEDDING_TABLE = "model.embed_tokens"  # a GGUF embedding in its own blocks (exact) in `linears`


Keep = Callable[[str], bool]  # which Hugging Face names to read


def everything(name: str) -> bool:
    return True


def layer(index: int) -> Keep:
    """The names of layer `index`."""
    return lambda name: name.startswith(f"model.layers.{index}.")


def outside_layers(name: str) -> bool:
    """The names of the embedding, the final norm and the output layer."""
    return not name.startswith("model.layers.")


@dataclass
class SourceWeights:
    linears: Quantized  # module name -> weight
    dense: dict[str, torch.Tensor]  # parameter name -> float32 (norms, biases, embedding)
    forms: dict[str, str]  # module name -> how it was made, e.g. "Q4 = Q4_K (exact)"
    origin: str


# GGUF names of the float tensors besides the linear weights -> Hugging Face parameter names
_DENSE = {"token_embd.weight": EMBEDDING, "output_norm.weight": "model.norm.weight"}
_PER_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
              "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
              "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
              "attn_k_norm.weight": "self_attn.k_norm.weight"}


def _dense_name(gguf_name: str) -> str | None:
    if gguf_name in _DENSE:
        return _DENSE[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+\.\w+)", gguf_name)
    if match and match.group(2) in _PER_LAYER:
        return f"model.layers.{match.group(1)}.{_PER_LAYER[match.group(2)]}"
    return None


def _in_mode(decoded: Q4Weight | Q8Weight | torch.Tensor, kind: str, mode: str, name: str
             ) -> tuple[Q4Weight | Q8Weight, str]:
    """A decoded GGUF tensor in the form `mode` asks, and a note of what was done."""
    if mode == "int3":
        if name == HEAD:
            return _rounded(decoded, lambda rows: q4_rtn(rows, 32)), f"Q4 rounded from {kind}"
        return _rounded(decoded, q3_rtn), f"Q3 rounded from {kind}"
    if isinstance(decoded, Q8Weight):
        return decoded, f"Q{decoded.bits} = {kind} (exact)"
    if isinstance(decoded, Q4Weight):
        if mode == "int4":
            return decoded, f"Q{decoded.bits} = {kind} (exact)"
        return _rounded(decoded, q8_rtn), f"Q8 rounded from {kind}"
    if mode == "int4":
        raise SpecdecError(f"{name}: a {kind} linear weight, which specdec's native runtime cannot run exactly "
                           "(it keeps Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K); use --runtime hf, "
                           "or --draft-quant int3 for a draft")
    return _rounded(decoded, q8_rtn), f"Q8 rounded from {kind}"


_ROUND_ROWS = 8192  # rows rounded at once: a whole tied head's float32 form and its rounding's temporaries took 3 GB


def _rounded(decoded: Q4Weight | Q8Weight | torch.Tensor, rounding: Callable[[torch.Tensor], Q4Weight | Q8Weight]
             ) -> Q4Weight | Q8Weight:
    """`rounding` of the float weight `decoded` stands for, a chunk of rows at a time: every
    rounding here works row by row, so the result is the whole tensor's bit for bit."""
    rows = decoded.shape[0] if isinstance(decoded, torch.Tensor) else decoded.codes.shape[0]
    parts = []
    for at in range(0, rows, _ROUND_ROWS):
        parts.append(rounding(_float_rows(decoded, at, at + _ROUND_ROWS)))
        return_freed_memory()  # the chunk's temporaries, which glibc kept between the parts some runs
    return parts[0] if len(parts) == 1 else stacked(parts)


def _float_rows(decoded: Q4Weight | Q8Weight | torch.Tensor, start: int, end: int) -> torch.Tensor:
    if isinstance(decoded, torch.Tensor):
        return decoded[start:end]
    return dataclasses.replace(decoded, **{f: getattr(decoded, f)[start:end] for f in tensor_fields(decoded)}
                               ).dequantize()


def read_gguf(path: Path | GGUFReader, cfg: DecoderConfig, mode: str, keep: Keep = everything) -> SourceWeights:
    """The weights of a GGUF file or its open reader (see the module docstring); `keep`: only
    those whose Hugging Face name it accepts (a layer at a time: the decoded blocks of the whole
    1.5B model take 1.5 GB)."""
    reader = path if isinstance(path, GGUFReader) else GGUFReader(str(path))
    path = Path(reader.data.filename) if hasattr(reader.data, "filename") else Path(str(path))
    rotary_heads = {"self_attn.q_proj": cfg.heads, "self_attn.k_proj": cfg.kv_heads}
    linears: Quantized = {}
    forms: dict[str, str] = {}
    for name, kind, decoded in linear_weights(reader, keep):
        heads = rotary_heads.get(name.split(".", 3)[-1]) if cfg.model_type == "llama" else None
        if heads:  # llama.cpp interleaves a Llama model's q/k rows for its rotary layout
            decoded = rows_unpermuted(decoded, heads)
        linears[name], forms[name] = _in_mode(decoded, kind, mode, name)
    dense: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _dense_name(tensor.name)
        if name is None or not keep(name):
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        kind = tensor.tensor_type
        if name == EMBEDDING and kind in EXACT:  # looked up a row at a time, so kept in its blocks
            decoded = decode_exact(kind, tensor.data, shape)
            linears[EMBEDDING_TABLE], forms[EMBEDDING_TABLE] = decoded, f"{kind.name} rows decoded per token (exact)"
        else:
            values = np.asarray(quants.dequantize(tensor.data, kind), dtype=np.float32).reshape(shape)
            dense[name] = decoded = torch.from_numpy(values.copy())  # the reader's arrays are read-only memory maps
        if name == EMBEDDING and cfg.tied:
            linears[HEAD], forms[HEAD] = _in_mode(decoded, f"{kind.name} (tied embedding)", mode, HEAD)
    _check_complete(cfg, linears, dense, str(path), keep)
    return SourceWeights(linears, dense, forms, str(path))


def read_model(model: PreTrainedModel, cfg: DecoderConfig, mode: str) -> SourceWeights:
    """A dense Hugging Face model's weights, every linear layer rounded (int4: Q4 in groups of
    32, the output layer Q8; int8: Q8; int3: Q3, the output layer Q4)."""
    head = model.get_output_embeddings().weight.detach()
    if mode == "int3":
        out_layer = model.get_output_embeddings()
        linears = {name: q3_rtn(m.weight.detach()) for name, m in model.named_modules()
                   if type(m) is torch.nn.Linear and m is not out_layer}
        linears[HEAD] = q4_rtn(head, 32)
    else:
        linears = quantize_weights(model, mode, None, 32)
        linears[HEAD] = q8_rtn(head)
    forms = {name: f"{_form(w)} rounded from {model.dtype}" for name, w in linears.items()}
    dense = {name: p.detach().float() for name, p in model.named_parameters()
             if p.dim() == 1 or name == EMBEDDING}
    _check_complete(cfg, linears, dense, type(model).__name__)
    return SourceWeights(linears, dense, forms, type(model).__name__)


def _form(weight: Q4Weight | Q8Weight) -> str:
    return f"Q{weight.bits}"


def _check_complete(cfg: DecoderConfig, linears: Quantized, dense: dict[str, torch.Tensor], origin: str,
                    keep: Keep = everything) -> None:
    """Every weight the decoder reads (that `keep` accepts) is there (else the file is of another layout)."""
    needed = [HEAD, "model.norm.weight", EMBEDDING if EMBEDDING in dense else EMBEDDING_TABLE]
    for i in range(cfg.layers):
        layer = f"model.layers.{i}."
        needed += [layer + n for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                       "input_layernorm.weight", "post_attention_layernorm.weight")]
        if cfg.qk_norm:
            needed += [layer + f"self_attn.{p}_norm.weight" for p in "qk"]
        if cfg.qkv_bias:
            needed += [layer + f"self_attn.{p}_proj.bias" for p in "qkv"]
    missing = [n for n in needed if keep(n) and n not in linears and n not in dense]
    if missing:
        raise SpecdecError(f"{origin} lacks {len(missing)} weights the decoder needs (first: {missing[0]}); "
                           "is it a Llama-family model of this config?")


__all__ = ["EMBEDDING", "EMBEDDING_TABLE", "HEAD", "SourceWeights", "read_gguf", "read_model"]
