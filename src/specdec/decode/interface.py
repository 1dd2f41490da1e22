"""What the engine and the draft proposers need of a model: a runtime that holds one KV cache
over a prefix of the sequence and forwards blocks at explicit positions over it.

specdec.decode.lm.CausalLM implements it over a transformers model (any architecture); another
runtime (specdec's own for the Llama family) implements the same members, so the engine, the
verifiers and the proposers never see which one runs.
"""

from __future__ import annotations

from typing import Protocol

import torch


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
    # when column i scores token i (specdec.models.draft_head).
    head_ids: torch.Tensor | None

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


def runtime_of(target, preallocate: bool = True) -> Runtime:
    """The runtime a generation runs `target` on: a transformers model in a fresh decode.lm.CausalLM
    (`preallocate` False: transformers' concatenating cache, cat=1), any other runtime as it is
    (it starts a fresh cache at its next prefill). A runtime is told by its members, so a native
    one never imports transformers' model classes (seconds at start-up)."""
    from ..errors import SpecdecError

    if not hasattr(target, "prefill"):  # a transformers model, not a Runtime
        from .lm import CausalLM

        return CausalLM(target, preallocate=preallocate)
    if not preallocate:
        raise SpecdecError("cat=1 measures transformers' concatenating KV cache: run it with --runtime hf")
    return target
