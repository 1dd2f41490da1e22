"""The `--methods` list: `ar,ar:cat=1,auto,draft:k=4,draft-int8:k=4:vocab=32768,draft:k=3:width=2,lookup:k=8:ngram=3,hybrid:k=3,hf-ar,hf-assisted:k=6,hf-lookup:k=10`.

Methods are separated by commas and a method's options by colons, so the list needs no quoting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import SpecdecError

# Options each kind accepts; ar and hf-ar guess nothing, so they take none.
# conf=P: adaptive k, stop after a guess below P% draft confidence; vocab=N: the draft scores
# only the N most frequent token ids (specdec.draft_head); width=W: tree of the draft's chain
# plus W-1 alternative leaves per depth (specdec.proposers.tree); pay=1: adaptive k by the cost
# model, from the cost terms of bench's --pay-rule file (specdec.adaptive); cat=1: KV caches
# grown by concatenation (transformers' DynamicCache) instead of preallocated buffers, to
# measure what the preallocated layout (specdec.cache.PreallocatedLayer) gives.
OPTIONS = {
    "ar": ("cat",),
    "auto": (),  # what `generate --proposer auto` runs here (specdec.auto), resolved at the start
    "draft": ("k", "conf", "pay", "vocab", "width", "cat"),
    "draft-int8": ("k", "conf", "pay", "vocab", "width", "cat"),  # the draft with int8 linear layers (specdec.quantize)
    "lookup": ("k", "ngram", "cat"),
    "hybrid": ("k", "ngram", "vocab", "cat"),  # lookup when an n-gram matches, else the draft
    "hf-ar": (),
    "hf-assisted": ("k",),
    "hf-lookup": ("k", "ngram"),
}
# The proposer each HF method mirrors, for its default k.
_MIRRORS = {"hf-assisted": "draft", "hf-lookup": "lookup", "draft-int8": "draft"}


@dataclass(frozen=True)
class Method:
    label: str  # canonical spelling, every option written out: the key of its rows
    kind: str
    k: int | None = None
    ngram: int | None = None
    conf: int | None = None  # percent
    vocab: int | None = None  # token ids the draft scores; None: all
    width: int | None = None  # tree: 1 + alternatives per depth; None: a chain
    pay: int | None = None  # 1: stop guessing when the cost model says the next guess won't pay
    cat: int | None = None  # 1: transformers' concatenating KV cache instead of the preallocated one

    @property
    def is_hf(self) -> bool:
        return self.kind.startswith("hf-")

    @property
    def needs_draft(self) -> bool:
        return self.kind in ("draft", "draft-int8", "hybrid", "hf-assisted")


def parse_methods(text: str, default_k: Mapping[str, int], default_ngram: int) -> list[Method]:
    """Parse the comma list; `default_k` maps draft/lookup to their k when none is written."""
    methods = [parse_method(part.strip(), default_k, default_ngram) for part in text.split(",")]
    labels = [m.label for m in methods]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise SpecdecError(f"--methods lists {duplicates[0]} twice")
    return methods


def parse_method(text: str, default_k: Mapping[str, int], default_ngram: int) -> Method:
    kind, *options = text.split(":")
    if kind not in OPTIONS:
        raise SpecdecError(f"unknown method {kind!r} in --methods; use: {', '.join(OPTIONS)}")
    values = dict(_option(text, kind, option) for option in options)
    if not OPTIONS[kind]:
        return Method(kind, kind)
    if "k" in OPTIONS[kind] and "k" not in values:
        values["k"] = default_k[_MIRRORS.get(kind, kind)]
    if "ngram" in OPTIONS[kind]:
        values.setdefault("ngram", default_ngram)
    if values.get("conf", 0) >= 100:
        raise SpecdecError(f"conf in method {text!r} is a percentage below 100, got {values['conf']}")
    label = ":".join([kind, *(f"{o}={values[o]}" for o in OPTIONS[kind] if o in values)])
    return Method(label, kind, **values)


def resolve_auto(choice, default_ngram: int) -> Method:
    """The method an `auto` choice (specdec.auto.Choice) stands for."""
    if choice.proposer == "none":
        return Method("ar", "ar")
    return parse_method(f"{choice.proposer}:k={choice.k}", {}, default_ngram)


def _option(text: str, kind: str, option: str) -> tuple[str, int]:
    key, sep, value = option.partition("=")
    if not sep or key not in OPTIONS[kind]:
        allowed = ", ".join(f"{o}=N" for o in OPTIONS[kind]) or "no options"
        raise SpecdecError(f"bad option {option!r} in method {text!r}; {kind} takes {allowed}")
    try:
        number = int(value)
    except ValueError:
        raise SpecdecError(f"{key} in method {text!r} must be a whole number, got {value!r}") from None
    if number < 1:
        raise SpecdecError(f"{key} in method {text!r} must be >= 1, got {number}")
    return key, number
