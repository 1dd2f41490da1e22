"""Streams committed text to the terminal, marking which tokens the proposer guessed."""

from __future__ import annotations

import sys

GREEN, RESET = "\033[32m", "\033[0m"


class Streamer:
    """Prints the text as it is committed. Decoding the whole output each round keeps
    multi-byte characters and merged pieces right; an unfinished character is held back."""

    def __init__(self, tokenizer, color: bool, out=None):
        self.tokenizer, self.color, self.out = tokenizer, color, out or sys.stdout
        self.tokens: list[int] = []
        self._printed = ""

    def on_commit(self, tokens: list[int], from_draft: int) -> None:
        self.tokens += tokens[:from_draft]
        self._emit(GREEN if self.color else "")
        self.tokens += tokens[from_draft:]
        self._emit("")

    def _emit(self, style: str) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self._printed):
            return
        new = text[len(self._printed):]
        if new:
            self.out.write(f"{style}{new}{RESET}" if style else new)
            self.out.flush()
            self._printed = text

    def finish(self) -> None:
        self.out.write("\n")
        self.out.flush()
