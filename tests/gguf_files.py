"""Small GGUF files written for the tests with gguf-py: random weights of a llama (with
rope_freqs), qwen2 or qwen3 model, every linear weight in a chosen block type, and the tokenizer
metadata of a real file (SmolLM2's, shipped with the test set-up), so transformers can read the
same file as the reference."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants

T = GGMLQuantizationType
SHAPES = {"hidden": 256, "inter": 512, "heads": 4, "kv_heads": 2, "layers": 2}
K_QUANTS = {T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}  # fp16 scale fields of each block


def smollm2_gguf() -> Path:
    from specdec.registry import REGISTRY, _piece_paths

    return _piece_paths(REGISTRY["smollm2-135m-instruct"])[0]


VOCAB = 2048  # of SmolLM2's 49152 tokens: a small file, read in a blink


@cache
def tokenizer_fields() -> dict:
    """SmolLM2's tokenizer metadata (gpt2 byte-level BPE, its chat template) cut to its first
    VOCAB tokens (the special ones, the 256 bytes, the first merges' results) and the merges
    among them, which is a whole tokenizer of its own."""
    from specdec.gguf.metadata import token_texts

    reader = GGUFReader(str(smollm2_gguf()))
    merges_field = reader.get_field("tokenizer.ggml.merges")
    tokens = list(token_texts(reader)[:VOCAB])
    known = set(tokens)
    merges = [m for m in (bytes(merges_field.parts[i]).decode() for i in merges_field.data)
              if all(p in known for p in (*m.split(" "), m.replace(" ", "")))]
    types = reader.get_field("tokenizer.ggml.token_type")
    return {"tokens": tokens, "types": [int(types.parts[i][0]) for i in types.data[:VOCAB]], "merges": merges,
            "template": reader.get_field("tokenizer.chat_template").contents()}


def _blocks(weight: np.ndarray, kind: T, rng: np.random.Generator) -> np.ndarray:
    """`weight` [out, in] in `kind`'s blocks: gguf-py quantizes the legacy types; K-quants get
    random codes under small scales (gguf-py writes none), which decode to what they decode to."""
    if kind in (T.F32, T.F16, T.BF16) or kind not in K_QUANTS:
        return quants.quantize(weight.astype(np.float32), kind)
    elems, size = quants.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (weight.size // elems, size), dtype=np.uint8)
    for at in K_QUANTS[kind]:
        raw[:, at : at + 2] = (rng.random(raw.shape[0]) * 2e-3 + 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(weight.shape[0], -1)


def write_model(path: Path, arch: str, kind: T = T.Q8_0, seed: int = 0, head_dim: int = 64, tied: bool = False,
                rope_freqs: bool = False, tokens: list[str] | None = None, template: str | None = None,
                **overrides) -> Path:
    """A GGUF model file at `path` (see the module docstring); `tokens` replaces the token list,
    `template` SmolLM2's chat template."""
    s = SHAPES | overrides
    rng = np.random.default_rng(seed)
    fields = tokenizer_fields()
    vocab = len(tokens or fields["tokens"])
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(s["layers"])
    w.add_context_length(2048)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["inter"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "qwen3" or head_dim != s["hidden"] // s["heads"]:  # Qwen3 files always say it
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = tokens or fields["tokens"]
    w.add_token_list(tokens)
    w.add_token_types([*fields["types"], *[4] * (len(tokens) - len(fields["types"]))][: len(tokens)])  # 4: user-defined
    known = set(tokens)  # a shorter token list keeps only the merges among its tokens
    w.add_token_merges([m for m in fields["merges"] if all(p in known for p in (*m.split(" "), m.replace(" ", "")))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(template or fields["template"])

    def dense(name: str, shape: tuple[int, ...], scale: float = 1.0, center: float = 0.0) -> None:
        w.add_tensor(name, (center + rng.standard_normal(shape) * scale).astype(np.float32))

    def linear(name: str, out: int, inputs: int, kind: T = kind) -> None:
        weight = rng.standard_normal((out, inputs)).astype(np.float32) * inputs ** -0.5
        blocks = _blocks(weight, kind, rng)
        w.add_tensor(name, blocks, raw_dtype=None if blocks.dtype != np.uint8 else kind)

    hidden, q_width, kv_width = s["hidden"], s["heads"] * head_dim, s["kv_heads"] * head_dim
    linear("token_embd.weight", vocab, hidden, T.Q8_0)
    dense("output_norm.weight", (hidden,), 0.1, 1.0)
    if not tied:
        linear("output.weight", vocab, hidden)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", (1.0 + rng.random(head_dim // 2) * 7).astype(np.float32))
    for i in range(s["layers"]):
        at = f"blk.{i}."
        dense(at + "attn_norm.weight", (hidden,), 0.1, 1.0)
        dense(at + "ffn_norm.weight", (hidden,), 0.1, 1.0)
        linear(at + "attn_q.weight", q_width, hidden)
        linear(at + "attn_k.weight", kv_width, hidden)
        linear(at + "attn_v.weight", kv_width, hidden)
        linear(at + "attn_output.weight", hidden, q_width)
        linear(at + "ffn_gate.weight", s["inter"], hidden)
        linear(at + "ffn_up.weight", s["inter"], hidden)
        linear(at + "ffn_down.weight", hidden, s["inter"])
        if arch == "qwen2":
            for p, width in (("q", q_width), ("k", kv_width), ("v", kv_width)):
                dense(at + f"attn_{p}.bias", (width,), 0.2)
        if arch == "qwen3":
            dense(at + "attn_q_norm.weight", (head_dim,), 0.1, 1.0)
            dense(at + "attn_k_norm.weight", (head_dim,), 0.1, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
