"""`--proposer auto` resolved: the method the saved advice (or the device's measured default)
chose for these arguments' setup, asking about the draft only what the choice needs (its
vocabulary, whether it runs int3 here) without loading it."""

from __future__ import annotations

import argparse

from ..methods.spec import Method, resolve_auto
from .args import setup_of


def resolve(args: argparse.Namespace, method: Method) -> tuple[Method, str | None]:
    """`auto` replaced by what the saved advice (or the device default) chose, with auto's own
    options where that method takes them; and a line saying so (None for other methods)."""
    from ..tune.saved import choose

    if method.kind != "auto":
        return method, None
    chosen, why = choose(setup_of(args, method.vocab), lambda: draft_vocabulary(args),
                         lambda quant: draft_runs(args, quant))
    resolved, dropped = resolve_auto(method, chosen)
    shown = "plain decoding" if resolved.kind == "ar" else resolved.label
    unused = f"; {', '.join(dropped)} not applied" if dropped and resolved.kind != "ar" else ""
    return resolved, f"{shown} ({why}){unused}"


def draft_runs(args: argparse.Namespace, quant: str | None) -> bool:
    """Whether --draft runs in the weight form `quant` where --runtime puts it (int3: only on
    specdec's native runtime)."""
    from ..errors import SpecdecError
    from ..quant import NATIVE_ONLY
    from ..runtime.choose import use_native

    if quant not in NATIVE_ONLY:
        return True
    try:
        return use_native(args.runtime, args.draft, quant, args.device)
    except SpecdecError:  # --runtime native and a draft it cannot run: the draft's loader says so later
        return False


def draft_vocabulary(args: argparse.Namespace) -> int | None:
    """The vocabulary size of --draft (a GGUF's metadata, a local folder's config), read without
    loading weights; None where there is no draft or no readable config (a hub id is not fetched
    for this)."""
    from pathlib import Path

    from ..gguf import gguf_path, is_gguf, prepared

    if is_gguf(args.draft):
        return prepared(gguf_path(args.draft))[1].config.vocab
    if not Path(args.draft).is_dir():
        return None
    from transformers import AutoConfig

    where = args.draft
    try:
        return AutoConfig.from_pretrained(where, trust_remote_code=args.trust_remote_code).vocab_size
    except (OSError, ValueError):
        return None
