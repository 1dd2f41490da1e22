"""The K/V budget the decode scheduler (decode.scheduler) admits requests within: what a request
claims (positions in whole chunks, as it grows), why one can never fit, and the prefix caches'
entries (runtime.native.prefix_cache), which count within the same budget and are evicted least
recently used before the scheduler preempts anyone. A request that takes over an entry's run
claims its positions as its own, and one that reads an entry's positions in place claims only
the rest (they are the entry's, which no eviction frees while it is read), so a slot counts
once; the draft's entries are kept to no more positions than the target's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .batch import rows_of
from .interface import PrefixCache

if TYPE_CHECKING:
    from .request import Request


@dataclass
class KVBudget:
    """`tokens` positions (None: no bound) claimed `chunk` at a time by requests whose rounds guess
    up to `guesses` tokens; `caches`: the target's prefix cache, then the draft's (none: off)."""

    tokens: int | None
    chunk: int
    guesses: int
    caches: list[PrefixCache] = field(default_factory=list)

    def rounded(self, positions: int) -> int:
        return math.ceil(positions / self.chunk) * self.chunk

    def claim(self, request: Request, cold: bool = False) -> int:
        """The positions the target's cache may hold for `request` at the end of this round,
        rounded up to whole chunks: its committed tokens but the pending one, then a round's
        block (the pending token and the guesses); one without its first token yet holds its
        prompt first. Never more than it asked for, nor (unless `cold`: started without the
        cache) the positions it reads in place from a cached entry (those count as the entry's)."""
        d = request.decoding
        if d is None or not d.new:
            positions = len(request.prompt) + 1 + self.guesses
        else:
            positions = d.length + d.guesses()
        return self.rounded(min(positions, request.asked) - (0 if cold else self.shared(request)))

    def shared(self, request: Request) -> int:
        """Positions of `request`'s target lane read in place from a cached entry: once started,
        what its lane reads; before, what a start would read now (a stopped one's lanes read none)."""
        if not self.caches:
            return 0
        if request.decoding is not None:
            return self.caches[0].shared(request.decoding.lm)
        return self.caches[0].match(torch.as_tensor(request.prompt, dtype=torch.long).flatten()).shared

    def pinned(self, request: Request | None = None) -> int:
        """Positions of the target's entries no eviction frees for `request`: those live lanes
        read in place and the one it would read (None: those live lanes read)."""
        if not self.caches:
            return 0
        return self.caches[0].pinned(None if request is None else _rows(request))

    def room_error(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """Why a request of this size can never run here (None: it can, alone at least)."""
        if self.tokens is None:
            return None
        need = self.rounded(prompt_tokens + max_new_tokens)
        if need <= self.tokens:
            return None
        return (f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_new_tokens}) need {need} K/V positions, "
                f"more than the server's whole budget of {self.tokens} (--kv-tokens): shorten the prompt or "
                f"lower max_tokens")

    def cached(self) -> int:
        """Positions the target's cached entries hold."""
        return self.caches[0].held() if self.caches else 0

    def evict(self, positions: int, sparing: torch.Tensor | None = None) -> None:
        """Free `positions` of the target's entries (least recently used first), sparing the one a
        lane starting `sparing` would take over."""
        if positions > 0 and self.caches:
            self.caches[0].evict(positions, sparing)

    def evict_for(self, request: Request, running: int) -> None:
        """Evict entries until `request` fits beside the `running` claims, sparing the one it
        would take over (its positions become the request's own, counted in its claim)."""
        rows = _rows(request)
        taken = self.caches[0].match(rows).taken()
        self.evict(running + self.claim(request) + self.cached() - taken - self.tokens, rows)

    def bound_drafts(self) -> None:
        """The draft's cached entries: no more positions than the target's."""
        if len(self.caches) == 2:
            self.caches[1].evict(self.caches[1].held() - self.caches[0].held())

    def clear(self) -> None:
        for cache in self.caches:
            cache.clear()


def _rows(request: Request) -> torch.Tensor:
    """What `request`'s target lane starts from the prefix cache."""
    d = request.decoding
    return rows_of(d) if d is not None else torch.as_tensor(request.prompt, dtype=torch.long).flatten()
