"""Committed tokens -> the text a client sees, one token at a time, with stop strings.

Decoding: a token's text depends on its neighbours (a byte-level BPE splits characters across
tokens, SentencePiece drops a leading space at the start), so the text after each token is the
decode of a short window (from the last point where the text was stable) minus the decode of
the same window without the new tokens; a window that ends inside a character (U+FFFD) waits
for the next token. At the end the whole output is decoded once, so the text sent adds up to
`tokenizer.decode(tokens, skip_special_tokens=True)` exactly (unless a stop string cut it).

Stop strings: the text is searched for each stop string as it grows; the reply ends before the
first one found, and the tokens after the one that completed it are dropped. Text that could be
the start of a stop string is held back until the next token decides.
"""

from __future__ import annotations

import threading


class TextStream:
    def __init__(self, tokenizer, stops: tuple[str, ...] = (), lock: threading.Lock | None = None):
        self.tokenizer, self.stops = tokenizer, stops
        self.lock = lock or threading.Lock()  # the tokenizer's: other threads encode prompts
        self.tokens: list[int] = []
        self.text = ""  # the stable text so far (every token up to _read decoded)
        self.sent = 0  # characters of `text` given out
        self.stopped = False
        self._prefix = 0  # window start: tokens before it are settled
        self._read = 0  # tokens whose text is in `text`
        self._longest = max((len(s) for s in stops), default=0)

    def push(self, token: int) -> str:
        """Take one committed token; the text it releases (possibly ""). After a stop string,
        `stopped` is set and further tokens are not taken."""
        assert not self.stopped
        self.tokens.append(token)
        with self.lock:
            before = self._decode(self.tokens[self._prefix : self._read])
            after = self._decode(self.tokens[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd") and after.startswith(before):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.tokens)
        return self._release()

    def finish(self) -> str:
        """The rest of the text at the end of the generation: everything decoded afresh (a
        character left unfinished shows as U+FFFD), unless a stop string ended it."""
        if not self.stopped:
            with self.lock:
                whole = self._decode(self.tokens)
            if whole.startswith(self.text[: self.sent]):
                self.text = whole
        if self.stopped:
            return ""
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out

    def _release(self) -> str:
        start = max(0, self.sent - self._longest + 1)
        found = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if found:
            cut = max(self.sent, min(i for i, _ in found))
            self.text = self.text[:cut]
            self.stopped = True
            out = self.text[self.sent:]
            self.sent = len(self.text)
            return out
        end = len(self.text) - self._held_back()
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        for n in range(min(self._longest - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""


def piece(tokenizer, token: int) -> str:
    """One token's own text, special tokens included (a logprobs entry's `token`)."""
    return tokenizer.decode([token], skip_special_tokens=False)
