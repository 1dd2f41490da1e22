"""Per-generation records: rounds, calls, acceptance per round and per position, phase times."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

# Where a generation's time goes: the prefill (up to the first new token), then the phases of
# the decode rounds.
PHASES = ("prefill", "propose", "verify", "accept", "other")
DECODE_PHASES = PHASES[1:]


@dataclass
class GenerationStats:
    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0  # includes the draft's prefill call (its time is charged to prefill)
    proposed: int = 0
    accepted: int = 0
    accept_lengths: list[int] = field(default_factory=list)  # accepted draft tokens, per round
    proposed_lengths: list[int] = field(default_factory=list)  # proposed draft tokens, per round
    # draft model forwards per round (a tree's alternatives and a hybrid's lookup rounds take none)
    draft_steps: list[int] = field(default_factory=list)
    # [i]: rounds in which guess i+1 was judged (proposed, and guesses 1..i accepted)
    position_judged: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)  # [i]: rounds that accepted guess i+1
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    new_tokens: int = 0
    tokens_per_s: float = 0.0  # decode part: tokens after the first, over the time after prefill

    def record_round(self, proposed: int, accepted: int, draft_steps: int = 0) -> None:
        self.rounds += 1
        self.proposed += proposed
        self.accepted += accepted
        self.proposed_lengths.append(proposed)
        self.accept_lengths.append(accepted)
        self.draft_steps.append(draft_steps)
        _grow(self.position_judged, min(proposed, accepted + 1))
        _grow(self.position_accepted, accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target call in the decode part (accepted + the target's own)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """[i]: P(guess i+1 accepted | guesses 1..i accepted and guess i+1 proposed)."""
        return [a / j for a, j in zip(self.position_accepted, self.position_judged)]

    @property
    def decode_seconds(self) -> float:
        """Time after the prefill: every decode round's phases."""
        return decode_seconds(self.times)

    def finish(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        decode = self.decode_seconds
        self.tokens_per_s = (new_tokens - 1) / decode if decode > 0 and new_tokens > 1 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            position_acceptance=self.position_acceptance,
        )
        return d


def decode_seconds(times: dict[str, float]) -> float:
    """The decode part of a phase-time record (GenerationStats.times, or a bench row's times)."""
    return sum(times.get(phase, 0.0) for phase in DECODE_PHASES)


def _grow(counts: list[int], upto: int) -> None:
    counts.extend([0] * (upto - len(counts)))
    for i in range(upto):
        counts[i] += 1


class PhaseClock:
    """Charges wall time to phases. On CUDA a lap records an event instead of synchronising,
    so timing adds no host synchronisation per round; `settle` reads the events once, at the
    end, and charges the GPU time between them (kernels are counted where they run)."""

    def __init__(self, times: dict[str, float], device: torch.device):
        self.times = times
        self._cuda = device.type == "cuda"
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._last = self._mark()

    def _mark(self):
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, phase: str) -> None:
        now = self._mark()
        if self._cuda:
            self._pending.append((phase, self._last, now))
        else:
            self.times[phase] += now - self._last
        self._last = now

    def settle(self) -> None:
        """Charge the laps whose time is still on the device (CUDA); a no-op elsewhere."""
        if self._pending:
            self._pending[-1][2].synchronize()
            for phase, start, end in self._pending:
                self.times[phase] += start.elapsed_time(end) / 1e3
            self._pending.clear()
