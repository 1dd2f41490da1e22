"""NativeLM: the engine's model interface (what specdec.decode.lm.CausalLM offers it) on the native
decoder. Every row is computed from itself and the cache slots it sees (kernels/decoder.cpp),
so any forward, prefill included, gives each row the bits of that row decoded alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..decode.rows import PREFILL_CHUNK, shared_prefix, tree_layout
from ..errors import SpecdecError
from .native import Decoder

_LONG = torch.long


class NativeLM:
    """A model on the native decoder together with its cache (a prefix of the sequence in
    slots 0 .. length-1; a tree forward appends its nodes in slots, keep_positions compacts)."""

    device = torch.device("cpu")
    dtype = torch.float32  # of activations, logits and K/V (the weights are Q4/Q8)
    invariant = True  # every row as if decoded alone, logits float32

    def __init__(self, decoder: Decoder, eos_token_ids: Sequence[int], max_positions: int | None):
        self.decoder = decoder
        self.vocab_size = decoder.head_rows
        self.head_ids = decoder.weights.head_ids  # token id of each logits column, None: column = id
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.max_positions = max_positions  # the cache grows up to it (None: without a bound)
        self.layers = decoder.weights.config.layers
        self._held = torch.zeros(decoder.capacity, dtype=_LONG)  # token ids behind the slots
        self._length = 0
        self.calls = 0
        self.nonfinite_at = torch.full((), -1, dtype=_LONG)

    @property
    def length(self) -> int:
        return self._length

    def layer_lengths(self) -> list[int]:
        return [self._length] * self.layers  # one length for all layers, by construction

    def reset(self) -> None:
        self._length = 0
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
        tokens = tokens.to(_LONG).contiguous()
        n, start = tokens.numel(), self._length
        positions = torch.arange(start, start + n, dtype=_LONG)
        none = torch.zeros(n + 1, dtype=_LONG)
        return self._run(tokens, positions, positions + 1, none, none[:0], n - 1 if last_only else 0)

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Score [root, nodes...] in one forward (see CausalLM.forward_tree): row i at position
        length + depth(i), seeing the cache and the slots of its ancestors and itself, in that
        order, which are the keys and order of the chain row at that position."""
        start = self._length
        depth, sees = tree_layout(parents.tolist())
        tokens = tokens.to(_LONG).contiguous()
        positions = start + torch.tensor(depth, dtype=_LONG)
        extra = start + sees.nonzero()[:, 1]  # row-major: each row's visible nodes, ascending
        extra_start = torch.zeros(len(depth) + 1, dtype=_LONG)
        extra_start[1:] = sees.sum(1).cumsum(0)
        prefix = torch.full((len(depth),), start, dtype=_LONG)
        return self._run(tokens, positions, prefix, extra_start, extra.contiguous(), 0)

    def weight_bytes(self) -> int:
        """Bytes of weights a forward reads (specdec.tune.measure)."""
        return self.decoder.weights.nbytes()

    def kv_bytes(self, positions: int | None = None) -> int:
        """Bytes of the cache's keys and values at `positions` positions (None: all allocated)."""
        return self.decoder.kv_bytes(positions)

    def _room(self, end: int) -> None:
        """Cache slots up to `end`: the cache doubles (within max_positions) when it runs out."""
        if end <= self.decoder.capacity:
            return
        if self.max_positions is not None and end > self.max_positions:
            raise SpecdecError(f"the sequence would reach {end} positions, past the model's {self.max_positions}")
        grown = max(end, 2 * self.decoder.capacity)
        grown = grown if self.max_positions is None else min(grown, self.max_positions)
        self.decoder.grow(grown, keep=self._length)
        held = torch.zeros(grown, dtype=_LONG)
        held[: self._length] = self._held[: self._length]
        self._held = held

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor, extra_start: torch.Tensor,
             extra: torch.Tensor, first: int) -> torch.Tensor:
        start, n = self._length, tokens.numel()
        self._room(start + n)
        slots = torch.arange(start, start + n, dtype=_LONG)
        logits = self.decoder.forward(tokens, positions, slots, prefix, extra_start, extra, first)
        self._held[start : start + n] = tokens
        self._length = start + n
        self.calls += 1
        # A sum is finite only if every term is (else a term is inf or NaN, or the sum overflowed:
        # then the exact test decides); torch's isfinite over a 32768-wide row took 0.18 ms, a
        # sum 0.01 ms.
        if int(self.nonfinite_at) < 0 and not math.isfinite(float(logits.sum())):
            finite = torch.isfinite(logits).all(-1)
            if not bool(finite.all()):
                self.nonfinite_at = torch.tensor(start + first + int((~finite).nonzero()[0, 0]), dtype=_LONG)
        return logits

    def keep_positions(self, start: int, offsets: list[int]) -> None:
        """Keep positions [0, start), then slots start + offsets[j] moved to start + j."""
        span = self._length - start
        if list(offsets) != sorted(set(offsets)) or any(not 0 <= o < span for o in offsets):
            raise ValueError(f"offsets {offsets} must increase and lie in [0, {span})")
        source = start + torch.tensor(offsets, dtype=_LONG)
        target = start + torch.arange(len(offsets), dtype=_LONG)
        self.decoder.move(source, target)
        self._held[target] = self._held[source]
        self._length = start + len(offsets)
