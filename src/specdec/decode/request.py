"""One prompt as the decode scheduler holds it (decode.scheduler): what was asked, and once it
started, its Decoding; apart from the scheduler so that its K/V accounting (decode.kv_budget)
reads requests without importing the scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sequence import Decoding, Options


@dataclass(eq=False)
class Request:
    """One prompt to decode: what was asked, the caller's `tag` (a server's job), and, once it
    started, its Decoding."""

    prompt: torch.Tensor | Sequence[int]
    options: Options
    tag: object = None
    order: int = 0  # arrival rank: the waiting queue's order
    decoding: Decoding | None = None
    preempted: int = 0  # times its lanes were taken back for room
    failures: int = 0  # failed rounds it was in
    cached: int | None = None  # prompt positions its first start took from the prefix cache (None: no cache)

    @property
    def asked(self) -> int:
        """The positions it may reach: what preemption weighs."""
        return len(self.prompt) + self.options.max_new_tokens
