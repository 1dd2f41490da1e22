"""The prefix cache of one model's slot pool: the K/V of sequences that ended stay in the pool
as entries keyed by the token ids they hold, and a new lane starts from the longest prefix of
its tokens that an entry or a live lane holds, forwarding only the rest.

A lane starts from an entry by adopting the entry's run of slots when it reuses most of it (the
conversation case: the next turn's prompt is the last turn's prompt and answer, then a new
message; nothing is copied), else by copying the prefix's slots into a run of its own
(Decoder.move; the entry stays for others), and from a live lane (two requests with one system
prompt) by copying. A copy reads and writes a position's keys and values once, where a forward
recomputes them through every weight: for the 1.5B target ~57 KB a position against ~3 GFLOP.

Why a flat list of whole runs, searched by a vectorised first-difference per entry, rather than
SGLang's radix tree or vLLM's hashed blocks: the decoder's attention reads a row's keys as one
stretch of slots, so an entry is a whole run and a prefix is reused where it lies; the entries
are few (a budget of tens of thousands of positions holds tens of conversations) and one
comparison over 2,000 tokens takes microseconds; and the match ends at any token, not at a
block's edge. A lane's positions are computed the same whatever forward they came from (every
row as if decoded alone), so a lane started from the cache continues bit for bit as one that
forwarded its whole prompt."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from ..rows import shared_prefix

if TYPE_CHECKING:
    from .slot_pool import SlotPool


@dataclass(eq=False)
class Entry:
    """The run of slots of a sequence that ended: `held` the token ids behind its first `length`
    slots; `used` orders entries by their last use (least recently used evicted first)."""

    base: int
    size: int
    held: torch.Tensor
    length: int
    used: int = 0


class Lane(Protocol):
    """What the cache needs of a sequence's lane (runtime.native.native_lm.NativeLM): stated
    here so that the cache, which the lane holds, does not import the lane's module."""

    @property
    def length(self) -> int: ...

    @property
    def held_tokens(self) -> torch.Tensor: ...

    def adopt(self, entry: Entry, length: int) -> None: ...

    def copy_from(self, base: int, tokens: torch.Tensor) -> None: ...

    def hand_over(self) -> Entry: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class Match:
    """Where a lane's tokens would start: `length` positions from `source` (an Entry or a live
    lane; None: nothing to reuse), the entry's run taken over when `adopts`."""

    length: int = 0
    source: object = None
    adopts: bool = False

    def taken(self) -> int:
        """Positions this start moves out of the cache's entries (into the lane's run)."""
        return self.source.length if self.adopts else 0


@dataclass(eq=False)
class PrefixCache:
    """The entries and live lanes of one slot pool (all lanes of one model share it)."""

    pool: SlotPool
    entries: list[Entry] = field(default_factory=list)
    _live: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    _clock: itertools.count = field(default_factory=itertools.count)

    def held(self) -> int:
        """Positions the entries hold together."""
        return sum(e.length for e in self.entries)

    def match(self, tokens: torch.Tensor) -> Match:
        """Where a lane starting `tokens` would start: the longest prefix held, but never the last
        token (its row gives the next token's logits)."""
        most = tokens.numel() - 1
        best = Match()
        for source, held in self._sources():
            n = shared_prefix(held, tokens[:most]) if most > 0 else 0
            if n > best.length:
                adopts = isinstance(source, Entry) and 2 * n >= source.length
                best = Match(n, source, adopts)
        return best

    def start(self, lane: Lane, tokens: torch.Tensor) -> int:
        """Start `lane` (holding nothing) from the longest held prefix of `tokens`; the positions
        it now holds. The lane counts as live from here (a later lane may copy from it)."""
        if lane.length:
            raise ValueError("a lane starts from the prefix cache before anything is forwarded on it")
        self._live.add(lane)
        found = self.match(tokens)
        if not found.length:
            return 0
        source = found.source
        if found.adopts:
            self.entries.remove(source)
            lane.adopt(source, found.length)
        else:
            base = source.base if isinstance(source, Entry) else source.run_base
            lane.copy_from(base, tokens[: found.length])
            if isinstance(source, Entry):
                source.used = next(self._clock)
        return found.length

    def park(self, lane: Lane) -> None:
        """End `lane`'s sequence keeping its positions as an entry (the lane holds nothing after).
        An entry that holds a prefix of another holds nothing a lane could not take from that one
        (the same prompt answered again, a client that left part way): only the longer stays, as
        recently used as the two."""
        self._live.discard(lane)
        tokens = lane.held_tokens
        covering = next((e for e in self.entries if _starts(e.held[: e.length], tokens)), None) if lane.length else None
        if covering is not None or not lane.length:
            lane.release()
            if covering is not None:
                covering.used = next(self._clock)
            return
        for entry in [e for e in self.entries if _starts(tokens, e.held[: e.length])]:
            self._drop(entry)
        entry = lane.hand_over()
        entry.used = next(self._clock)
        self.entries.append(entry)

    def evict(self, positions: int, sparing: torch.Tensor | None = None) -> int:
        """Free at least `positions` positions, least recently used entries first (never the one
        a lane starting `sparing` would adopt); the positions freed (less if the entries run out)."""
        spared = self.match(sparing).source if sparing is not None else None
        freed = 0
        for entry in sorted(self.entries, key=lambda e: e.used):
            if freed >= positions:
                break
            if entry is not spared:
                freed += entry.length
                self._drop(entry)
        return freed

    def clear(self) -> None:
        """Drop every entry (after a fault whose effect on the cache is unknown)."""
        for entry in list(self.entries):
            self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.pool.release(entry)

    def _sources(self):
        """(source, token ids its slots hold) for every entry and every live lane holding any."""
        for entry in self.entries:
            yield entry, entry.held[: entry.length]
        for lane in list(self._live):
            if lane.length:
                yield lane, lane.held_tokens


def _starts(longer: torch.Tensor, prefix: torch.Tensor) -> bool:
    """Whether `longer` starts with `prefix`."""
    return prefix.numel() <= longer.numel() and shared_prefix(longer, prefix) == prefix.numel()
