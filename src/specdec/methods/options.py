"""The options of method specs: how each value is read and what it means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..quant import DRAFT_MODES


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not 0.0 < value < 1.0:
        raise ValueError("must lie strictly between 0 and 1")
    return value


def _switch(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("takes 1 (on) or 0 (off)")
    return text == "1"


def _quant(text: str) -> str | None:
    if text not in DRAFT_MODES:
        raise ValueError(f"takes {', '.join(DRAFT_MODES)}")
    return None if text == "none" else text


def _name(text: str) -> str:
    if not text or not all(c.isalnum() or c in "_.-" for c in text):
        raise ValueError("takes letters, digits, '_', '.' and '-'")
    return text


def _width(text: str) -> int | None:
    value = _whole(text)
    return None if value == 1 else value  # one token per depth: a plain chain


# option -> (how its value is read, what it means); the order is the label's.
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "k": (_whole, "tokens guessed per round (the most, with conf or pay)"),
    "ngram": (_whole, "longest n-gram prompt lookup matches"),
    "quant": (_quant, "the draft's linear layers as 8-, 4- or 3-bit codes (specdec.models.draft_quant; int3: "
                      "native runtime)"),
    "vocab": (_whole, "the draft scores only the N most frequent token ids (specdec.models.draft_head)"),
    "conf": (_probability, "adaptive k: a round stops after a draft probability below P"),
    "pay": (_switch, "adaptive k by the cost model, from --pay-rule FILE (specdec.proposers.policy)"),
    "dyn": (_switch, "adaptive k from acceptance: 2 more guesses after a round that accepted all, 1 fewer after one that did not"),
    "width": (_width, "tree: beside each draft guess its W-1 next most likely tokens"),
    "cat": (_switch, "KV caches grown by concatenation (transformers') instead of preallocated"),
    "name": (_name, "the endpoint's name in --endpoint NAME=URL (specdec.external.endpoints)"),
    "memory": (_switch, "auto: a draft chain chosen runs with a memory of earlier requests' prompts and outputs "
                        "(suffix+draft: the memory's confident guesses, else the draft's); specdec serve's default"),
}
