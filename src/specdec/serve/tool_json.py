"""JSON text read as it arrives (a model's tool call, token by token): where a call's head
`{"name": "...", "arguments": ` ends, where a JSON value ends, whether a tail of the text may
begin a tag."""

from __future__ import annotations

import json

WHITESPACE = " \t\r\n"


def tag_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that begins `tag` (held back: the tag may follow)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def read_head(text: str, key: str):
    """`{"name": "<name>", "<key>": ` at the start of `text` (whitespace allowed between):
    (name, where the arguments' value starts); None: the text may still become one; False: it
    cannot."""
    i, name = 0, None
    for part in ("{", '"name"', ":", None, ",", f'"{key}"', ":"):
        i = _skip_space(text, i)
        if part is None:
            if i >= len(text):
                return None
            if text[i] != '"':
                return False
            try:
                name, i = json.JSONDecoder().raw_decode(text, i)
            except ValueError:
                return None if _open_string(text, i) else False
            continue
        got = text[i : i + len(part)]
        if got != part:
            return None if part.startswith(got) and i + len(got) == len(text) else False
        i += len(part)
    i = _skip_space(text, i)
    return None if i >= len(text) else (name, i)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def _open_string(text: str, i: int) -> bool:
    """Whether the string starting at text[i] is unfinished (no closing quote yet)."""
    escaped = False
    for c in text[i + 1:]:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            return False
        elif c == "\n":
            return False
    return True


class JsonValue:
    """Scans one JSON value's text as it arrives and says where it ends: an object or array at
    its closing bracket, a string at its closing quote, a number or literal before the first
    character that cannot continue it."""

    def __init__(self):
        self.done = False
        self._depth = 0
        self._string = self._escaped = False
        self._kind: str | None = None

    def take(self, text: str) -> int:
        """How many characters of `text` belong to the value (all, until it is done)."""
        for n, c in enumerate(text):
            if self._kind is None:
                self._kind = "nest" if c in "{[" else "string" if c == '"' else "scalar"
                self._string = self._kind == "string"
                self._depth = 1 if c in "{[" else 0
                continue
            if self._string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._string = False
                    if self._kind == "string":
                        self.done = True
                        return n + 1
                continue
            if self._kind == "scalar":
                if c in ",}]" + WHITESPACE:
                    self.done = True
                    return n
                continue
            if c == '"':
                self._string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return n + 1
        return len(text)
