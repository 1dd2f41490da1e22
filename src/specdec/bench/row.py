"""A bench row's measurements as one typed record, whichever engine produced them.

Every row carries the new tokens, prefill_s (up to the first new token), decode_s (the rest),
decode_tokens (tokens produced after the first chunk) and tokens_per_s = decode_tokens /
decode_s, the engine's definition. Phase times, acceptance per round and per position exist only
for specdec's methods (None elsewhere); a server's own fields (its text, time to first token,
its acceptance counters) travel in `served`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Measured:
    new_tokens: list[int] | None  # None: a server that names no token ids (its text is compared)
    n_new: int
    finish_reason: str
    prefill_s: float
    decode_s: float
    decode_tokens: int
    times: dict[str, float]
    rounds: int | None = None
    proposed: int | None = None
    accepted: int | None = None
    accept_lengths: list[int] | None = None
    proposed_lengths: list[int] | None = None
    position_judged: list[int] | None = None
    position_accepted: list[int] | None = None
    round_tokens: list[int] | None = None  # transformers': tokens committed per target call
    target_calls: int | None = None
    draft_calls: int | None = None
    peak_memory_bytes: int | None = None  # None: not this process's to measure (a server)
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens > 0 and self.decode_s > 0 else None

    def fields(self) -> dict[str, Any]:
        """The row's measurement fields as results.jsonl stores them."""
        out = asdict(self)
        served = out.pop("served")
        return {**out, "tokens_per_s": self.tokens_per_s, **served}
