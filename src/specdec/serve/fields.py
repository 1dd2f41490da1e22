"""Typed, bounded reads of one field of a request's JSON body: a value of the wrong type, a number
outside its range (an integer past int64, a float beyond float's range, NaN, infinity) or text
that is not valid Unicode is a 400 that names the field, so nothing the sampler, the tokenizer or
the JSON encoder of the reply would raise on reaches them."""

from __future__ import annotations

import math

from .errors import invalid

INT64 = (-(2**63), 2**63 - 1)  # what a seed may be (vLLM's bound); every integer field lies within it


def flag(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{param or name} must be true or false, got {_shown(value)}", param or name)
    return value


def number(body: dict, name: str, default: float | None, low: float, high: float, rule: str) -> float | None:
    """A finite number in [low, high], as a float; `rule` says the range in the error message."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"{name} must be a number, got {_shown(value)}", name)
    try:
        value = float(value)  # an integer of hundreds of digits overflows here
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and low <= value <= high):
        raise invalid(f"{name} must be {rule}, got {_shown(body[name])}", name)
    return value


def integer(body: dict, name: str, low: int = INT64[0], high: int = INT64[1]) -> int | None:
    """An integer in [low, high] (a float with no fraction counts: JSON has one number type)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer, got {_shown(value)}", name)
    if not low <= value <= high:
        raise invalid(f"{name} must be between {low} and {high}, got {_shown(value)}", name)
    return value


def check_text(value: object, where: str = "") -> None:
    """Every string in a parsed body (keys too) must be valid Unicode: JSON's escapes can spell a
    lone surrogate ("\\ud800"), which no tokenizer encodes and no UTF-8 reply can echo. The body's
    nesting is bounded before it is parsed (serve.body), so this recursion is too."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid(f"{where or 'the body'} holds text that is not valid Unicode (a lone surrogate, "
                          f"{value[e.start]!r}, at character {e.start}): send UTF-8 text", where or None,
                          "invalid_text") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{where} (a key)".strip())
            check_text(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{where}[{i}]")


def _shown(value: object) -> str:
    """A value for an error message, cut short (a number may have thousands of digits)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
