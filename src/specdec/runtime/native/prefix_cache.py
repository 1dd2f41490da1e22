"""The prefix cache of one model's slot pool: the K/V of sequences that ended stay in the pool
as entries keyed by the token ids they hold, and a new lane starts from the longest prefix of
its tokens that an entry or a live lane holds, forwarding only the rest.

A lane takes over an entry's run when nothing else reads it and the lane reuses most of it (the
conversation case: the next turn's prompt is the last turn's prompt and answer, then a new
message); else it reads the prefix in place (n answers to one prompt, two clients with one
system prompt: a live lane's first positions become an entry where they lie, read by both), so
a prefix's keys and values lie once in the pool however many lanes read it. A lane is at most
two runs: a shared prefix (a single-run entry's, reference-counted: never evicted while read)
and its own; an entry parked by a lane keeps that shape. What lies in a second run it does not
take over it copies (Decoder.move: for the 1.5B target ~57 KB a position against ~3 GFLOP for
a forward). The decoder's attention walks a row's keys in the order of their positions
whichever run holds them, so every row gets the bits of a cold start.

Why a flat list of whole runs, searched by a vectorised first-difference per entry, rather than
SGLang's radix tree or vLLM's hashed blocks: a prefix is reused where it lies, the entries are
few (a budget of tens of thousands of positions holds tens of conversations) and one comparison
over 2,000 tokens takes microseconds; and the match ends at any token, not at a block's edge."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from ..rows import shared_prefix
from .cache_entry import Entry

if TYPE_CHECKING:
    from .slot_pool import SlotPool


class Lane(Protocol):
    """What the cache needs of a sequence's lane (runtime.native.native_lm.NativeLM): stated
    here so that the cache, which the lane holds, does not import the lane's module."""

    @property
    def length(self) -> int: ...

    @property
    def held_tokens(self) -> torch.Tensor: ...

    @property
    def shared(self) -> tuple[Entry | None, int]: ...

    def slots(self, lo: int, hi: int) -> torch.Tensor: ...

    def adopt(self, entry: Entry, length: int) -> None: ...

    def share(self, entry: Entry, length: int) -> None: ...

    def freeze(self, length: int) -> Entry: ...

    def copy_from(self, slots: torch.Tensor, tokens: torch.Tensor) -> None: ...

    def hand_over(self) -> Entry: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class Match:
    """Where a lane's tokens would start: `length` positions from `source` (an Entry or a live
    lane; None: nothing to reuse), the entry's run taken over when `adopts`, the first `shared`
    positions read in place from an entry's run (counted once, as the entry's; from a live lane
    that reads none in place, its first `length` positions become that entry)."""

    length: int = 0
    source: object = None
    adopts: bool = False
    shared: int = 0

    def taken(self) -> int:
        """Positions this start moves out of the cache's entries (into the lane's own run)."""
        return self.source.own() if self.adopts else 0


@dataclass(eq=False)
class PrefixCache:
    """The entries and live lanes of one slot pool (all lanes of one model share it)."""

    pool: SlotPool
    entries: list[Entry] = field(default_factory=list)
    _live: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    _clock: itertools.count = field(default_factory=itertools.count)

    def held(self) -> int:
        """Slots the entries hold together (a prefix read by several counted once)."""
        return sum(e.own() for e in self.entries)

    def pinned(self, sparing: torch.Tensor | None = None) -> int:
        """Slots of the entries live lanes read in place, and those a lane starting `sparing`
        would read or copy from (no eviction frees them)."""
        read = [lane.shared[0] for lane in list(self._live)]
        if sparing is not None:
            found = self.match(sparing)
            read.append(_read_by(found) if found.shared else None)
            read.append(found.source if isinstance(found.source, Entry) and not found.adopts else None)
        return sum(e.own() for e in {id(e): e for e in read if e is not None}.values())

    def shared(self, lane: Lane) -> int:
        """Positions `lane` reads in place from an entry's run (they count as the entry's)."""
        return lane.shared[1] if lane.shared[0] is not None else 0

    def match(self, tokens: torch.Tensor) -> Match:
        """Where a lane starting `tokens` would start: the longest prefix held, but never the last
        token (its row gives the next token's logits)."""
        most = tokens.numel() - 1
        best = Match()
        for source, held in self._sources():
            n = shared_prefix(held, tokens[:most]) if most > 0 else 0
            if n > best.length:
                best = _start_from(source, n)
        return best

    def start(self, lane: Lane, tokens: torch.Tensor) -> int:
        """Start `lane` (holding nothing) from the longest held prefix of `tokens`; the positions
        it now holds. The lane counts as live from here (a later lane may read from it)."""
        if lane.length:
            raise ValueError("a lane starts from the prefix cache before anything is forwarded on it")
        self._live.add(lane)
        found = self.match(tokens)
        n, source = found.length, found.source
        if not n:
            return 0
        if found.adopts:
            self.entries.remove(source)
            lane.adopt(source, n)
            return n
        if found.shared:
            if not isinstance(source, Entry) and source.shared[0] is None:
                self.entries.append(source.freeze(n))  # its first n positions, read in place by both
            read = _read_by(found)
            read.readers += 1
            read.used = next(self._clock)
            lane.share(read, found.shared)
        if n > found.shared:
            lane.copy_from(source.slots(found.shared, n), tokens[found.shared : n])
        if isinstance(source, Entry):
            source.used = next(self._clock)
        return n

    def park(self, lane: Lane) -> None:
        """End `lane`'s sequence keeping its positions as an entry (the lane holds nothing after).
        An entry that holds a prefix of another holds nothing a lane could not take from that one
        (the same prompt answered again, a client that left part way): only the longer stays, as
        recently used as the two (the shorter stays too while something reads it in place)."""
        self._live.discard(lane)
        tokens = lane.held_tokens
        covering = next((e for e in self._kept() if _starts(e.held[: e.length], tokens)), None) if lane.length else None
        if covering is not None or lane.length <= self.shared(lane):
            lane.release()
            if covering is not None:
                covering.used = next(self._clock)
            return
        if self._fold(lane):
            return
        for entry in [e for e in self._kept() if not e.readers and _starts(tokens, e.held[: e.length])]:
            self._drop(entry)
        entry = lane.hand_over()
        entry.used = next(self._clock)
        self.entries.append(entry)

    def _fold(self, lane: Lane) -> bool:
        """Where `lane` alone reads an entry that holds a prefix of its tokens, extend that entry
        with the lane's later positions and release the lane, when that copies no more positions
        than keeping both would hold twice: the positions between the lane's split and the
        entry's end hold the same keys in both (the same tokens at the same positions: the same
        bits), so the entry then holds the lane's sequence once. Whether it did."""
        entry, split = lane.shared
        tokens = lane.held_tokens
        if (entry is None or entry.readers != 1 or lane.length - entry.length > entry.length - split
                or not _starts(tokens, entry.held[: entry.length])):
            return False
        length, held = lane.length, torch.zeros(max(entry.size, lane.length), dtype=torch.long)
        entry.base = self.pool.resize(entry, held.numel(), keep=entry.length)
        entry.size = held.numel()
        self.pool.decoder.move(lane.slots(entry.length, length), entry.slots(entry.length, length))
        held[:length] = tokens
        entry.held, entry.length = held, length
        lane.release()
        entry.used = next(self._clock)
        return True

    def unread(self, entry: Entry) -> None:
        """A lane or entry stopped reading `entry`'s run (the last reader of a doomed one frees it)."""
        entry.readers -= 1
        if not entry.readers and entry.doomed:
            self._drop(entry)

    def evict(self, positions: int, sparing: torch.Tensor | None = None) -> int:
        """Free at least `positions` slots, least recently used entries that nothing reads first
        (never the one a lane starting `sparing` would adopt: dropping an entry may leave its
        parent unread, so the pass repeats); the slots freed (less if the entries run out)."""
        spared = self.match(sparing).source if sparing is not None else None
        freed, progress = 0, True
        while freed < positions and progress:
            progress = False
            for entry in sorted(self._kept(), key=lambda e: e.used):
                if freed >= positions:
                    break
                if entry is not spared and not entry.readers:
                    freed += entry.own()
                    self._drop(entry)
                    progress = True
        return freed

    def clear(self) -> None:
        """Drop every entry (after a fault whose effect on the cache is unknown); one a live lane
        still reads goes when that lane lets it go."""
        for entry in list(self.entries):
            entry.doomed = True
        for entry in list(self.entries):
            if entry in self.entries and not entry.readers:
                self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.pool.release(entry)
        if entry.parent is not None:
            self.unread(entry.parent)

    def _kept(self) -> list[Entry]:
        return [e for e in self.entries if not e.doomed]

    def _sources(self):
        """(source, token ids its slots hold) for every entry and every live lane holding any."""
        for entry in self._kept():
            yield entry, entry.held[: entry.length]
        for lane in list(self._live):
            if lane.length:
                yield lane, lane.held_tokens


def _read_by(found: Match) -> Entry:
    """The entry whose run a lane started as `found` says reads its first `found.shared` positions in."""
    source = found.source
    if isinstance(source, Entry):
        return source if source.parent is None and not found.adopts else source.parent
    return source.shared[0]


def _start_from(source: Entry | Lane, n: int) -> Match:
    """How a lane reuses `n` positions of `source`: an entry nothing reads, of which it reuses half
    or more and more than its parent's part, is taken over (its own run becomes the lane's, its
    parent read as before); one nothing reads, of which it reuses less than a quarter, is copied
    from (read in place, all of it would stay pinned for a few positions: a request preempted
    with 205 positions kept three 8-token requests over its prompt from running together in 256);
    else the lane reads in place what lies in a single-run entry (the source itself, what it
    reads, or a live lane's first n positions made one) and copies the rest."""
    if isinstance(source, Entry):
        whole = not source.readers and 2 * n >= source.length
        if source.parent is None:
            if whole:
                return Match(n, source, True, 0)
            return Match(n, source, False, n if source.readers or 4 * n >= source.length else 0)
        if whole and n > source.split:
            return Match(n, source, True, source.split)
        return Match(n, source, False, min(n, source.split))
    read, split = source.shared
    return Match(n, source, False, min(n, split) if read is not None else n)


def _starts(longer: torch.Tensor, prefix: torch.Tensor) -> bool:
    """Whether `longer` starts with `prefix`."""
    return prefix.numel() <= longer.numel() and shared_prefix(longer, prefix) == prefix.numel()
