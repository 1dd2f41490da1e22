"""A prefix cache entry (runtime.native.prefix_cache): the slots of a sequence that ended, in at
most two runs, and where each of its positions lies."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_LONG = torch.long


@dataclass(eq=False)
class Entry:
    """The slots of a sequence that ended: `held` the token ids behind its first `length`
    positions, those below `split` read in its `parent`'s run (at parent.base + j), the others
    in its own run from `base`; `readers` the lanes and entries that read its run in place
    (never evicted while any does); `used` orders entries by their last use (least recently
    used evicted first); `doomed`: dropped from the cache, freed when its last reader goes."""

    base: int
    size: int
    held: torch.Tensor
    length: int
    parent: Entry | None = None
    split: int = 0
    readers: int = 0
    used: int = 0
    doomed: bool = False

    def own(self) -> int:
        """Positions in its own run (the slots it alone holds)."""
        return self.length - self.split

    def slots(self, lo: int, hi: int) -> torch.Tensor:
        """The pool slots of its positions [lo, hi)."""
        return position_slots(self.parent.base if self.parent else 0, self.split, self.base, lo, hi)


def position_slots(shared_base: int, split: int, base: int, lo: int, hi: int) -> torch.Tensor:
    """The slots of positions [lo, hi) of a sequence that reads positions below `split` at
    shared_base + j and the others at base + j - split."""
    j = torch.arange(lo, hi, dtype=_LONG)
    return torch.where(j < split, shared_base + j, base - split + j)
