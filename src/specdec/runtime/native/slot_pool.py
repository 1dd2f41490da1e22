"""The native decoder's cache slots shared by the sequences of one model (the lanes of a batch):
each sequence holds one contiguous run of slots, so a row sees its own sequence's keys as one
stretch [base, base + length) and rows of several sequences go through one forward.

A run grows where it lies when the slots after it are free, else moves to a free stretch
large enough (its keys and values copied); when none is, the cache itself grows (doubling) and
keeps every slot. A released run's slots serve the next sequence, and the cache gives memory
back after a burst: once the runs still held end within a quarter of it, it shrinks to twice
their end (never below the size it started with), so a server's cache follows its load instead
of keeping its peak. Runs are placed at the lowest free base, so the live ones gather at the
start. `limit` bounds the slots all runs may hold together."""

from __future__ import annotations

import torch

from ...errors import SpecdecError
from .decoder import Decoder

_LONG = torch.long


class SlotPool:
    def __init__(self, decoder: Decoder, limit: int | None = None):
        self.decoder, self.limit = decoder, limit
        self._runs: dict[int, tuple[int, int]] = {}  # owner id -> (base, size)
        self._floor = decoder.capacity  # the cache never shrinks below its first size

    def held(self) -> int:
        """Slots the runs hold together."""
        return sum(size for _, size in self._runs.values())

    def claim(self, owner: object, size: int) -> int:
        """A run of `size` slots for `owner`; its base slot."""
        if id(owner) in self._runs:
            raise ValueError("this owner already holds a run: resize or release it")
        self._check_limit(size)
        base = self._free_stretch(size)
        self._runs[id(owner)] = (base, size)
        return base

    def resize(self, owner: object, size: int, keep: int) -> int:
        """Grow `owner`'s run to `size` slots keeping its first `keep`; its (maybe new) base."""
        base, old = self._runs[id(owner)]
        if size <= old:
            return base
        self._check_limit(size - old)
        del self._runs[id(owner)]
        if self._fits(base, size):
            self._runs[id(owner)] = (base, size)
            self._ensure(base + size)
            return base
        new = self._free_stretch(size)
        if keep:
            self.decoder.move(torch.arange(base, base + keep, dtype=_LONG), torch.arange(new, new + keep, dtype=_LONG))
        self._runs[id(owner)] = (new, size)
        return new

    def hand_over(self, owner: object, heir: object) -> None:
        """`owner`'s run becomes `heir`'s, where it lies (a prefix cache's entry and its lanes)."""
        if id(heir) in self._runs:
            raise ValueError("the heir already holds a run: release it first")
        self._runs[id(heir)] = self._runs.pop(id(owner))

    def split(self, owner: object, keep: int, heir: object) -> None:
        """The first `keep` slots of `owner`'s run become `heir`'s, where they lie; `owner` keeps
        the rest (none: it holds no run)."""
        if id(heir) in self._runs:
            raise ValueError("the heir already holds a run: release it first")
        base, size = self._runs.pop(id(owner))
        if not 0 < keep <= size:
            self._runs[id(owner)] = (base, size)
            raise ValueError(f"cannot split {keep} slots off a run of {size}")
        self._runs[id(heir)] = (base, keep)
        if keep < size:
            self._runs[id(owner)] = (base + keep, size - keep)

    def release(self, owner: object) -> None:
        if self._runs.pop(id(owner), None) is not None:
            self._shrink()

    def _shrink(self) -> None:
        """Give memory back when the runs still held end within a quarter of the cache: it
        becomes twice their end (a power of two times the first size), their slots kept. The
        quarter leaves room to grow before the next doubling, so a load that swings by less than
        4x does not resize the cache back and forth."""
        end = max((b + s for b, s in self._runs.values()), default=0)
        capacity = self.decoder.capacity
        if capacity <= self._floor or 4 * end > capacity:
            return
        size = self._floor
        while size < 2 * end:
            size *= 2
        if size < capacity:
            self.decoder.grow(size, keep=end)

    def _check_limit(self, more: int) -> None:
        if self.limit is not None and self.held() + more > self.limit:
            raise SpecdecError(f"the K/V cache would hold {self.held() + more} positions, past its limit of "
                               f"{self.limit} (fewer or shorter sequences at once, or raise the limit)")

    def _fits(self, base: int, size: int) -> bool:
        return all(b + s <= base or base + size <= b for b, s in self._runs.values())

    def _free_stretch(self, size: int) -> int:
        """The lowest base of `size` free slots (the cache grown when they lie past its end)."""
        end = 0
        for b, s in sorted(self._runs.values()):
            if b - end >= size:
                break
            end = max(end, b + s)
        self._ensure(end + size)
        return end

    def _ensure(self, end: int) -> None:
        capacity = self.decoder.capacity
        if end > capacity:
            self.decoder.grow(max(end, 2 * capacity), keep=capacity)
