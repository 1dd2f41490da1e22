"""A bench row's measurements as one typed record, whichever engine produced them.

Every row carries the new tokens, prefill_s (up to the first new token), decode_s (the rest),
decode_tokens (tokens produced after the first chunk) and tokens_per_s = decode_tokens /
decode_s, the engine's definition. specdec's own methods add the engine's record of the
generation (`stats`: decode.stats.GenerationStats, stored whole and versioned); transformers'
rows their forward hooks' counts and the streamer's chunk sizes; a server's own fields (its
text, time to first token, the acceptance counters it reports) travel in `served`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decode.stats import GenerationStats


@dataclass
class Measured:
    new_tokens: list[int] | None  # None: a server that names no token ids (its text is compared)
    n_new: int
    finish_reason: str
    prefill_s: float
    decode_s: float
    decode_tokens: int
    times: dict[str, float]
    stats: GenerationStats | None = None  # specdec's engine: its record of the generation
    rounds: int | None = None  # transformers': target calls after the first chunk
    round_tokens: list[int] | None = None  # transformers': tokens committed per target call
    target_calls: int | None = None  # transformers': forward calls counted by hooks
    draft_calls: int | None = None
    peak_memory_bytes: int | None = None  # None: not this process's to measure (a server)
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens > 0 and self.decode_s > 0 else None

    def fields(self) -> dict[str, Any]:
        """The row's measurement fields as results.jsonl stores them."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in ("stats", "served")}
        stats = None if self.stats is None else self.stats.to_dict()
        return {**out, "stats": stats, "tokens_per_s": self.tokens_per_s, **self.served}


def engine_stats(row: dict[str, Any]) -> GenerationStats | None:
    """The engine's record in a results.jsonl row (None: a row of transformers, llama.cpp or a
    server). Rows of version 1 hold its counts flat, with accept_lengths set for specdec's methods."""
    if "stats" in row:
        return None if row["stats"] is None else GenerationStats.from_dict(row["stats"])
    return GenerationStats.from_dict(row) if row.get("accept_lengths") is not None else None
