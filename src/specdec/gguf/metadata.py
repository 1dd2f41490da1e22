"""What a GGUF file says about the model in it, read from its metadata alone (nothing is
dequantized): the architecture and shapes the native decoder needs (specdec.decoder_config),
the end-of-generation token ids, and the tokenizer's kind and token texts. A file specdec cannot
run (another architecture, a rotary scaling it does not compute, a truncated or foreign file) is
refused here, before any weight is read, in one line that says what runs it instead."""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ..errors import SpecdecError
from ..decoder_config import ARCHITECTURES, DecoderConfig

MAGIC = b"GGUF"
# Token texts that end a generation besides the declared ids, as llama.cpp treats them (a Qwen
# file declares <|im_end|> but its chat ends at <|endoftext|> too).
END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
             "<end_of_turn>", "<EOT>")
END_IDS = ("eos_token_id", "eot_token_id", "eom_token_id")


@dataclass(frozen=True)
class GgufModel:
    """A GGUF model as specdec runs it: its shapes, where generation ends, its tokenizer."""

    path: str
    name: str  # general.name, or the file's stem
    config: DecoderConfig
    eos: tuple[int, ...]
    tokenizer_model: str  # tokenizer.ggml.model: gpt2 (byte-level BPE), llama (SentencePiece), ...
    tokens_digest: str  # of the token texts: a pair of one family compares these, not 151,936 strings
    read_tokens: Callable[[], tuple[str, ...]] = field(compare=False, repr=False)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The token texts by id (read on first use)."""
        return self.read_tokens()

    def record(self) -> dict:
        """What the model cache keeps of it (GgufModel.from_record reads it back)."""
        return {"path": self.path, "name": self.name, "config": self.config.as_dict(), "eos": list(self.eos),
                "tokenizer_model": self.tokenizer_model, "tokens_digest": self.tokens_digest}

    @classmethod
    def from_record(cls, record: dict, read_tokens: Callable[[], tuple[str, ...]]) -> GgufModel:
        return cls(record["path"], record["name"], DecoderConfig.from_dict(record["config"]), tuple(record["eos"]),
                   record["tokenizer_model"], record["tokens_digest"], cache(read_tokens))


def open_reader(path: Path) -> GGUFReader:
    """gguf-py's reader over the file, or a one-line error for a file that is not a whole GGUF."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SpecdecError(f"cannot read {path}: {e.strerror}") from None
    if magic != MAGIC:
        raise SpecdecError(f"{path} is not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
    except (ValueError, IndexError, OSError) as e:
        raise SpecdecError(f"{path} is truncated or damaged ({size} bytes; the reader said: {e}); "
                           "download or copy it again") from None
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise SpecdecError(f"{path} is truncated: its tensors need {end} bytes, the file has {size}; "
                           "download or copy it again")
    return reader


def release_pages(reader: GGUFReader) -> None:
    """Drop the file's pages this process has read from its resident memory (they stay in the
    page cache; a later read maps them again): reading a 1.1 GB file a layer at a time would
    otherwise hold all of it in the process's resident set until the reader is gone."""
    mapping = getattr(reader.data, "_mmap", None)  # numpy.memmap's own mmap object
    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def _value(reader: GGUFReader, key: str, default=None):
    field = reader.get_field(key)
    if field is None:
        return default
    if field.types and field.types[0] == GGUFValueType.ARRAY and len(field.types) > 1 \
            and field.types[-1] != GGUFValueType.STRING:
        return [v.item() for part in (field.parts[i] for i in field.data) for v in part]
    return field.contents()


def token_texts(reader: GGUFReader) -> tuple[str, ...]:
    field = reader.get_field("tokenizer.ggml.tokens")
    if field is None:
        return ()
    return tuple(bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data)


def describe(reader: GGUFReader, path: Path) -> GgufModel:
    """The model in the file (see the module docstring)."""
    arch = _value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise SpecdecError(f"{path}: architecture {arch!r}; specdec's native runtime runs {', '.join(ARCHITECTURES)} "
                           "GGUF files. For another architecture convert the model to a Hugging Face folder and "
                           "pass that folder with --runtime hf")
    tokens = token_texts(reader)
    config = DecoderConfig(**_shapes(reader, arch, path, tokens)).check()
    ends = {int(v) for k in END_IDS if (v := _value(reader, f"tokenizer.ggml.{k}")) is not None}
    ends |= {i for i, text in enumerate(tokens) if text in END_TEXTS}
    return GgufModel(str(path), str(_value(reader, "general.name", path.stem)), config, tuple(sorted(ends)),
                     str(_value(reader, "tokenizer.ggml.model", "")), tokens_digest(tokens), lambda: tokens)


def tokens_digest(tokens: tuple[str, ...]) -> str:
    return hashlib.sha256("\0".join(tokens).encode()).hexdigest()


def _shapes(reader: GGUFReader, arch: str, path: Path, tokens: tuple[str, ...]) -> dict:
    """DecoderConfig's fields from `<arch>.*` metadata and which tensors exist."""
    def get(key: str, default=None):
        value = _value(reader, f"{arch}.{key}", default)
        if isinstance(value, list):
            raise SpecdecError(f"{path}: {arch}.{key} differs between layers, which the native runtime does not run; "
                               "use --runtime hf")
        if value is None:
            raise SpecdecError(f"{path} lacks the metadata {arch}.{key}; is it a whole model file?")
        return value

    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim or int(get("rope.dimension_count", head_dim)) != head_dim:
        raise SpecdecError(f"{path}: values or rotary dimensions apart from head_dim {head_dim}; use --runtime hf")
    scaling = _value(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise SpecdecError(f"{path}: rotary scaling {scaling!r}, which the native runtime does not compute; "
                           "use --runtime hf")
    names = {t.name: t for t in reader.tensors}
    factors = names.get("rope_freqs.weight")
    vocab = len(tokens) or int(names["token_embd.weight"].shape[-1])
    return {"model_type": arch, "layers": int(get("block_count")), "hidden": hidden, "heads": heads,
            "kv_heads": int(get("attention.head_count_kv", heads)), "head_dim": head_dim,
            "inter": int(get("feed_forward_length")), "vocab": vocab,
            "eps": float(get("attention.layer_norm_rms_epsilon")), "qkv_bias": "blk.0.attn_q.bias" in names,
            "tied": "output.weight" not in names, "max_positions": int(get("context_length", 0)) or None,
            "rope_theta": float(get("rope.freq_base", 10000.0)), "qk_norm": "blk.0.attn_q_norm.weight" in names,
            "rope_factors": None if factors is None else tuple(np.asarray(factors.data, dtype=np.float32).tolist())}
