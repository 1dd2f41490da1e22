"""NativeLM: the engine's model interface (decode.interface.Runtime, as runtime.hf's CausalLM) on the native
decoder. Every row is computed from itself and the cache slots it sees (kernels/decoder.cpp),
so any forward, prefill included, gives each row the bits of that row decoded alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...errors import SpecdecError
from ..rows import PREFILL_CHUNK, shared_prefix, tree_layout
from .decoder import Decoder, Rows
from .cache_entry import Entry, position_slots
from .prefix_cache import PrefixCache
from .slot_pool import SlotPool

_LONG = torch.long


class NativeLM:
    """A model on the native decoder together with its cache: positions 0 .. length-1 of the
    sequence, those below `split` read in place in a prefix cache entry's run (shared with other
    lanes), the others in a run of its own; a tree forward appends its nodes in slots,
    keep_positions compacts."""

    device = torch.device("cpu")
    dtype = torch.float32  # of activations and logits (the weights are Q4/Q8, K/V binary16)
    invariant = True  # every row as if decoded alone, logits float32
    shares_forward = True  # forward_lanes: one decoder call for all lanes

    def __init__(self, decoder: Decoder, eos_token_ids: Sequence[int], max_positions: int | None,
                 pool: SlotPool | None = None, slots: int | None = None, prefixes: PrefixCache | None = None):
        """A sequence on `decoder`, its keys in a run of the `pool`'s slots (None: a pool of its
        own, with its prefix cache `prefixes`) that starts at `slots` slots (None: the decoder's
        capacity) and doubles on demand."""
        self.decoder = decoder
        self.pool = pool if pool is not None else SlotPool(decoder)
        self.prefixes = prefixes if prefixes is not None else PrefixCache(self.pool)
        self.vocab_size = decoder.head_rows
        self.head_ids = decoder.weights.head_ids  # token id of each logits column, None: column = id
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.max_positions = max_positions  # the cache grows up to it (None: without a bound)
        self.layers = decoder.weights.config.layers
        self._slots = decoder.capacity if slots is None else slots
        self._base, self._size = 0, 0  # the own run of slots held (none yet): position split at slot base
        self._shared: Entry | None = None  # the entry whose run holds positions below split
        self._split = 0
        self._held = torch.zeros(0, dtype=_LONG)  # token ids behind the slots
        self._length = 0
        self.calls = 0
        self.nonfinite_at = torch.full((), -1, dtype=_LONG)

    def lane(self, slots: int = 256) -> NativeLM:
        """Another sequence on the same weights and cache pool: forward_lanes runs several in
        one forward. Its slots are claimed at its first forward and freed by release()."""
        return NativeLM(self.decoder, self.eos_token_ids, self.max_positions, self.pool, slots, self.prefixes)

    def release(self) -> None:
        """Give the sequence's slots back to the pool (a later forward claims new ones) and stop
        reading its shared prefix."""
        self.pool.release(self)
        self._size = self._length = 0
        self._unshare()

    @property
    def length(self) -> int:
        return self._length

    @property
    def held_tokens(self) -> torch.Tensor:
        """The token ids behind the positions held."""
        return self._held[: self._length]

    @property
    def shared(self) -> tuple[Entry | None, int]:
        """The entry whose run holds this lane's first positions in place, and how many (None, 0: none)."""
        return self._shared, self._split

    def slots(self, lo: int, hi: int) -> torch.Tensor:
        """The pool slots of positions [lo, hi)."""
        return position_slots(self._shared.base if self._shared else 0, self._split, self._base, lo, hi)

    def hand_over(self) -> Entry:
        """The own run of slots and what the lane holds, handed to a prefix cache's entry, which
        reads the shared prefix in its place (the lane then holds nothing; a later forward
        claims new slots)."""
        if not self._size:
            raise ValueError("a lane that holds no run of its own has nothing to hand over (release it)")
        entry = Entry(self._base, self._size, self._held, self._length, self._shared, self._split)
        self.pool.hand_over(self, entry)
        self._size = self._length = self._split = 0
        self._shared = None
        self._held = torch.zeros(0, dtype=_LONG)
        return entry

    def adopt(self, entry: Entry, length: int) -> None:
        """Take over `entry`'s own run and what it reads in place (this lane holding nothing),
        keeping its first `length` positions (more than the entry reads in place)."""
        self.pool.hand_over(entry, self)
        self._base, self._size, self._held, self._length = entry.base, entry.size, entry.held, length
        self._shared, self._split = entry.parent, entry.split

    def share(self, entry: Entry, length: int) -> None:
        """Hold the first `length` positions of the single-run `entry` by reading them in place
        (this lane holding nothing; the caller counts it among the entry's readers)."""
        self._shared, self._split, self._length = entry, length, length
        with torch.inference_mode(False):  # updated in place in and out of inference mode
            self._held = entry.held[:length].clone()

    def freeze(self, length: int) -> Entry:
        """Make the first `length` positions (this lane reading none in place) an entry read by
        this lane in place: their slots stay where they are, the own run starts after them."""
        if self._shared is not None or not 0 < length <= min(self._length, self._size):
            raise ValueError(f"cannot freeze {length} positions of a lane holding {self._length} "
                             f"(reading {self._split} in place)")
        with torch.inference_mode(False):  # an entry made inside a draft's proposal lives on outside it
            entry = Entry(self._base, length, self._held[:length].clone(), length, readers=1)
        self.pool.split(self, length, entry)
        self._shared, self._split = entry, length
        self._base, self._size = self._base + length, self._size - length
        return entry

    def copy_from(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Append `tokens` by copying the keys and values of pool `slots` (where another sequence
        holds them at the same positions) into this lane's own run."""
        start, n = self._length, tokens.numel()
        self._room(start + n)
        self.decoder.move(slots, self.slots(start, start + n))
        self._held[start : start + n] = tokens
        self._length = start + n

    def _unshare(self) -> None:
        """Stop reading the shared prefix (from here the lane's positions lie in its own run)."""
        if self._shared is not None:
            self.prefixes.unread(self._shared)
        self._shared, self._split = None, 0

    def layer_lengths(self) -> list[int]:
        return [self._length] * self.layers  # one length for all layers, by construction

    def reset(self) -> None:
        self.trim(0)
        self.calls = 0
        self.nonfinite_at = torch.full((), -1, dtype=_LONG)

    def check_finite(self, position: int | None = None) -> None:
        where = int(self.nonfinite_at) if position is None else position
        if where >= 0:
            raise SpecdecError(f"the model produced NaN/inf logits at sequence position {where}; "
                               "check the model weights")

    def trim(self, length: int) -> None:
        """Keep the first `length` positions (moving a length: the slots stay as they are)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot trim a cache of {self._length} positions to {length}")
        self._length = length
        if length < self._split:  # the own run now starts at `length`: positions past it are free
            self._split = length
            if not length:
                self._unshare()

    def keep_prefix_of(self, tokens: torch.Tensor) -> None:
        self.trim(shared_prefix(self._held[: self._length], tokens))

    def prefill(self, prompt: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """Start a sequence (see CausalLM.prefill); the prompt runs in blocks of PREFILL_CHUNK
        rows, which here changes no bits."""
        if reuse:
            self.keep_prefix_of(prompt[:-1])
            self.calls = 0
            self.nonfinite_at = torch.full((), -1, dtype=_LONG)
        else:
            self.reset()
        rest = prompt[self._length :]
        while rest.numel() > PREFILL_CHUNK:
            self.forward(rest[:PREFILL_CHUNK], last_only=True)
            rest = rest[PREFILL_CHUNK:]
        return self.forward(rest, last_only=True)

    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append `tokens` at the next positions; float32 logits [n, vocab] (last_only: [1, vocab])."""
        return self.forward_lanes([(self, tokens, last_only)])[0]

    @staticmethod
    def forward_lanes(blocks: Sequence[tuple[NativeLM, torch.Tensor, bool]]) -> list[torch.Tensor]:
        """Append each (lane, tokens, last_only) block to its lane in one decoder forward: the lanes
        share the decoder and its pool (NativeLM.lane), the weights are read once for all their rows,
        and every row gets the bits it would get alone. Each lane's logits, as NativeLM.forward's."""
        decoder = blocks[0][0].decoder
        if any(lm.decoder is not decoder for lm, _, _ in blocks) or len({id(lm) for lm, _, _ in blocks}) < len(blocks):
            raise ValueError("forward_lanes takes distinct lanes of one decoder (NativeLM.lane)")
        for lm, tokens, _ in blocks:  # all room first: a run that moves or a cache that grows moves slots
            lm._room(lm.length + tokens.numel())
        parts = [lm._chain(tokens, last_only) for lm, tokens, last_only in blocks]
        logits = decoder.forward(Rows.join(parts))
        out, at = [], 0
        for (lm, _, _), part in zip(blocks, parts):
            count = part.wanted.numel()
            out.append(lm._appended(part, logits[at : at + count]))
            at += count
        return out

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Score [root, nodes...] in one forward (see CausalLM.forward_tree): row i at position
        length + depth(i), seeing the cache and the slots of its ancestors and itself, in that
        order, which are the keys and order of the chain row at that position."""
        if tokens.numel() != parents.numel() + 1:  # the kernel would read rows past the tokens given
            raise SpecdecError(f"a tree of {parents.numel()} nodes scores {parents.numel() + 1} tokens "
                               f"(the root and the nodes), not {tokens.numel()}")
        start = self._length
        depth, sees = tree_layout(parents.tolist())
        tokens = tokens.to(_LONG).contiguous()
        self._room(start + tokens.numel())
        n, lo = len(depth), self._origin()
        extra = lo + start + sees.nonzero()[:, 1]  # row-major: each row's visible nodes, ascending
        extra_start = torch.zeros(n + 1, dtype=_LONG)
        extra_start[1:] = sees.sum(1).cumsum(0)
        rows = Rows(tokens, start + torch.tensor(depth, dtype=_LONG), lo + torch.arange(start, start + n),
                    torch.full((n,), lo, dtype=_LONG), torch.full((n,), start, dtype=_LONG), *self._reads(n),
                    extra_start, extra.contiguous(), torch.arange(n))
        return self._appended(rows, self.decoder.forward(rows))

    def weight_bytes(self) -> int:
        """Bytes of weights a forward reads (specdec.tune.measure)."""
        return self.decoder.weights.nbytes()

    def kv_bytes(self, positions: int | None = None) -> int:
        """Bytes of the cache's keys and values at `positions` positions (None: all allocated)."""
        return self.decoder.kv_bytes(positions)

    def _room(self, end: int) -> None:
        """Cache slots up to position `end`: the own run doubles (within max_positions) when it runs out."""
        split = self._split
        if end <= split + self._size:
            return
        if self.max_positions is not None and end > self.max_positions:
            raise SpecdecError(f"the sequence would reach {end} positions, past the model's {self.max_positions}")
        grown = self._size or self._slots
        while grown < end - split:
            grown *= 2
        grown = grown if self.max_positions is None else min(grown, self.max_positions - split)
        if self._size:
            self._base = self.pool.resize(self, grown, keep=self._length - split)
        else:
            self._base = self.pool.claim(self, grown)
        with torch.inference_mode(False):  # updated in place in and out of inference mode
            held = torch.zeros(split + grown, dtype=_LONG)
            held[: self._length] = self._held[: self._length]
        self._held, self._size = held, grown

    def _origin(self) -> int:
        """The slot position 0 would have in the own run (position j >= split lies at origin + j)."""
        return self._base - self._split

    def _reads(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows.split and Rows.shared for `n` rows of this lane."""
        shared = self._shared.base if self._shared is not None else 0
        return torch.full((n,), self._split, dtype=_LONG), torch.full((n,), shared, dtype=_LONG)

    def _chain(self, tokens: torch.Tensor, last_only: bool) -> Rows:
        """The rows that append `tokens` (room made first): row i at the next position, seeing
        the sequence's slots up to and including its own."""
        tokens = tokens.to(_LONG).contiguous()
        n, start = tokens.numel(), self._length
        positions = torch.arange(start, start + n, dtype=_LONG)
        none, lo = torch.zeros(n + 1, dtype=_LONG), self._origin()
        return Rows(tokens, positions, lo + positions, torch.full((n,), lo, dtype=_LONG), positions + 1,
                    *self._reads(n), none, none[:0], torch.arange(n - 1 if last_only else 0, n))

    def _appended(self, rows: Rows, logits: torch.Tensor) -> torch.Tensor:
        """Record the rows just forwarded (their tokens behind their slots) and check the logits."""
        start, n = self._length, rows.tokens.numel()
        self._held[start : start + n] = rows.tokens
        self._length = start + n
        self.calls += 1
        # A sum is finite only if every term is (else a term is inf or NaN, or the sum overflowed:
        # then the exact test decides); torch's isfinite over a 32768-wide row took 0.18 ms, a
        # sum 0.01 ms.
        if int(self.nonfinite_at) < 0 and not math.isfinite(float(logits.sum())):
            finite = torch.isfinite(logits).all(-1)
            if not bool(finite.all()):
                first = int(rows.wanted[0])
                self.nonfinite_at = torch.tensor(start + first + int((~finite).nonzero()[0, 0]), dtype=_LONG)
        return logits

    def keep_positions(self, start: int, offsets: list[int]) -> None:
        """Keep positions [0, start), then slots start + offsets[j] moved to start + j."""
        span = self._length - start
        if list(offsets) != sorted(set(offsets)) or any(not 0 <= o < span for o in offsets) or start < self._split:
            raise ValueError(f"offsets {offsets} must increase and lie in [0, {span}), past the shared prefix")
        source = start + torch.tensor(offsets, dtype=_LONG)
        target = start + torch.arange(len(offsets), dtype=_LONG)
        self.decoder.move(self._origin() + source, self._origin() + target)
        self._held[target] = self._held[source]
        self._length = start + len(offsets)

