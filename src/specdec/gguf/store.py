"""A GGUF file's parts in the model cache, made once per file: the model's description
(metadata.GgufModel), its token texts and its tokenizer in transformers' fast form, under
`<cache>/gguf/<stem>-<key>/`, keyed by the file's size, modification time and a hash of its first
and last MiB (cheap for a multi-GB file; a file replaced by another of the same size at the same
nanosecond with the same ends would be missed). Parsing a GGUF's metadata in Python takes seconds
(151,936 token strings) and building its tokenizer ten more; reading these back takes well under one.
The native weights in each form live beside them (runtime.native.loader)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import cache
from pathlib import Path

from ..errors import SpecdecError
from ..files import COMPLETE_MARKER, cache_root, exclusive, remove, remove_stale_temps, scratch
from .metadata import GgufModel, describe, open_reader

FORMAT = 2  # of what a prepared folder holds
_ENDS = 1 << 20  # bytes hashed at each end of the file


def fingerprint(path: Path) -> dict:
    """What identifies the file's content cheaply (see the module docstring)."""
    stat = path.stat()
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        digest.update(f.read(_ENDS))
        f.seek(max(0, stat.st_size - _ENDS))
        digest.update(f.read(_ENDS))
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ends_blake2b": digest.hexdigest(), "format": FORMAT}


def folder_of(path: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps([str(path.resolve()), key], sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{path.stem}-{digest}"


def prepared(path: Path) -> tuple[Path, GgufModel]:
    """The file's cache folder and model, made first if missing or stale."""
    key = fingerprint(path)
    folder = folder_of(path, key)
    if not _complete(folder, key):
        root = folder.parent
        with exclusive(root, folder.name):
            if not _complete(folder, key):
                remove_stale_temps(root)
                _prepare(path, folder, key)
                _remove_older(path, folder)
    return folder, _read(folder)


@cache  # a command asks for a file's model several times (form, pair check, loads)
def _read(folder: Path) -> GgufModel:
    record = json.loads((folder / "model.json").read_text())
    return GgufModel.from_record(record, lambda: tuple(json.loads((folder / "tokens.json").read_text())))


def _remove_older(path: Path, current: Path) -> None:
    """The folders an earlier version of this file (or of specdec's format) left: its weights
    would otherwise stay on disk for good."""
    for other in current.parent.glob(f"{path.stem}-*"):
        try:
            made_for = json.loads((other / "model.json").read_text())["path"]
        except (OSError, ValueError, KeyError):
            continue
        if other != current and made_for == str(path):
            remove(other)


def _complete(folder: Path, key: dict) -> bool:
    try:
        return json.loads((folder / COMPLETE_MARKER).read_text()) == key
    except (OSError, ValueError):
        return False


def _prepare(path: Path, folder: Path, key: dict) -> None:
    print(f"specdec: reading {path.name}'s metadata and tokenizer (seconds, once)", file=sys.stderr)
    model = describe(open_reader(path), path)
    tokenizer = _tokenizer_from_gguf(path)
    with scratch(folder.parent, "") as tmp:
        tmp.mkdir()
        (tmp / "model.json").write_text(json.dumps(model.record(), indent=1))
        (tmp / "tokens.json").write_text(json.dumps(list(model.tokens)))
        tokenizer.save_pretrained(tmp / "tokenizer")
        (tmp / COMPLETE_MARKER).write_text(json.dumps(key))
        remove(folder)
        os.replace(tmp, folder)


def _tokenizer_from_gguf(path: Path):
    """transformers' own conversion of the GGUF's tokenizer (and chat template) to its fast form."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except (ValueError, KeyError, NotImplementedError) as e:
        raise SpecdecError(f"{path}: transformers cannot build its tokenizer ({e}); use a Hugging Face folder "
                           "with --runtime hf") from None


def tokenizer_of(name_or_path: str):
    """The tokenizer of a GGUF file (or a registry name's), from its metadata."""
    from .where import gguf_path

    folder, _ = prepared(gguf_path(name_or_path))
    return tokenizer(folder)


def tokenizer(folder: Path):
    """The prepared tokenizer of a GGUF's cache folder."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder / "tokenizer"), local_files_only=True)
