"""What the engine and the draft proposers need of a model: a runtime that holds one KV cache
over a prefix of the sequence and forwards blocks at explicit positions over it.

runtime.hf.causal_lm.CausalLM implements it over a transformers model (any architecture),
runtime.native.native_lm.NativeLM (specdec's own for the Llama family) the same members, so the engine, the
verifiers and the proposers never see which one runs. Callers reach a runtime through these
members only (tests/test_layers.py checks both runtimes against it and that nothing probes for a
member with getattr/hasattr).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

Block = tuple["Runtime", torch.Tensor, bool]  # (lane, tokens, last_only) of Runtime.forward_lanes


class PrefixCache(Protocol):
    """The K/V of ended sequences kept among a model's lanes (runtime.native.prefix_cache), so a
    lane starts from the longest prefix of its tokens held there instead of forwarding it."""

    def match(self, tokens: torch.Tensor):
        """Where a lane starting `tokens` would start: `.length` positions reused, `.taken()`
        of them moved out of the cache's entries, the first `.shared` read in place from one."""

    def start(self, lane: Runtime, tokens: torch.Tensor) -> int:
        """Start `lane` (holding nothing) from the longest held prefix of `tokens` but their last
        token; the positions it now holds."""

    def park(self, lane: Runtime) -> None:
        """Give `lane` back keeping its positions as an entry (instead of release)."""

    def held(self) -> int:
        """Positions the entries hold."""

    def shared(self, lane: Runtime) -> int:
        """Positions `lane` reads in place from an entry (counted as the entry's, once)."""

    def pinned(self, sparing: torch.Tensor | None = None) -> int:
        """Positions of the entries live lanes read in place, and the one a lane starting
        `sparing` would read: no eviction frees them."""

    def evict(self, positions: int, sparing: torch.Tensor | None = None) -> int:
        """Drop least recently used entries until `positions` are freed (never the one a lane
        starting `sparing` would take over); the positions freed."""

    def clear(self) -> None:
        """Drop every entry."""


@runtime_checkable
class Runtime(Protocol):
    device: torch.device
    vocab_size: int  # rows of the output layer: token ids it scores
    calls: int  # forwards since the last prefill
    # True: every row of a decode or verify forward is computed as it would be alone, so
    # speculative output is bit for bit the plain one (a target); False: a draft's forward.
    invariant: bool
    # First sequence position whose logits were NaN/inf since the last prefill, -1 if none; a
    # 0-d tensor on the device, read back with the round's tokens (sequence._fetch).
    nonfinite_at: torch.Tensor
    max_positions: int | None  # the context the model was trained for (None: unknown)
    eos_token_ids: tuple[int, ...]  # the model's own end-of-sequence ids (its generation config)
    # A draft's restricted output layer: the token id behind each logits column (sorted), None
    # when column i scores token i (models.draft_head).
    head_ids: torch.Tensor | None
    # True: forward_lanes runs the lanes' rows in one forward, each row with the bits it gets
    # alone (so a prompt may be forwarded in chunks beside other sequences' rounds); False: it
    # runs one forward per lane.
    shares_forward: bool
    # The K/V of ended sequences its lanes may start from (None: a runtime without one).
    prefixes: PrefixCache | None

    @property
    def length(self) -> int:
        """Positions the cache holds."""

    def check_finite(self, position: int | None = None) -> None:
        """Raise if a forward since the last prefill produced NaN/inf logits (`position`: the
        nonfinite_at value already read back)."""

    def prefill(self, prompt: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """Start a sequence with `prompt` (1-D ids); its last logits row [1, vocab], float32.
        `reuse` keeps cached positions that already hold the prompt's prefix."""

    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append `tokens` at the next positions; logits rows [n, vocab] (or the last, [1, vocab])."""

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Score [root, node 0..n-1] in one forward, node i under parents[i] (-1: the root);
        rows [n+1, vocab]. All n+1 positions are appended; keep_positions keeps a path."""

    def keep_positions(self, start: int, offsets: list[int]) -> None:
        """Keep the first `start` positions, then start + offsets[j] moved to start + j."""

    def keep_prefix_of(self, tokens: torch.Tensor) -> None:
        """Trim to the longest prefix of the cached positions that holds `tokens`' start."""

    def trim(self, length: int) -> None:
        """Keep the first `length` positions."""

    def layer_lengths(self) -> list[int]:
        """Positions held by each layer's cache (all equal in a consistent cache)."""

    def reset(self) -> None:
        """Empty the cache (the next forward starts a sequence)."""

    def lane(self, slots: int = 256) -> Runtime:
        """Another sequence on the same weights with a cache of its own, starting with room for
        `slots` positions (it grows on demand); forward_lanes runs several lanes together."""

    def release(self) -> None:
        """Give the lane's cache back (its sequence ended); a later forward starts afresh."""

    def forward_lanes(self, blocks: Sequence[Block]) -> list[torch.Tensor]:
        """Append each (lane, tokens, last_only) block to its lane (distinct lanes of this
        runtime's weights); each lane's logits, as its forward would return them. One forward
        for all where shares_forward, else one each."""

