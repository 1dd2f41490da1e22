"""A generation's speculation record (GenerationStats): filled by the decode loop round by round,
read by every reporter (generate's summary line, chat's speed line, bench rows and summaries, the
server's `timings` and /metrics, the calibration). Every figure derived from the counts
(acceptance rate, mean accepted length, acceptance per position, tokens/s) is computed here,
once; readers take the record, or its one serialisation (to_dict / from_dict), never its counts
by name from a dict. Also PhaseClock, which charges a generation's wall time to its phases."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from ..errors import SpecdecError

# Where a generation's time goes: the prefill (up to the first new token), then the phases of
# the decode rounds.
PHASES = ("prefill", "propose", "verify", "accept", "other")
DECODE_PHASES = PHASES[1:]

# to_dict's layout. Version 1 is a bench row (results.jsonl) written before the record was
# stored whole: its counts flat in the row, the new tokens' number in `n_new`, no draft steps.
STATS_VERSION = 2
# What to_dict adds to the counts for readers of the JSON (from_dict recomputes them).
DERIVED = ("acceptance_rate", "mean_accepted_length", "position_acceptance", "tokens_per_s")


@dataclass
class GenerationStats:
    """The counts and phase times of one generation (or, pooled, of several). The decode loop
    (decode.sequence.Decoding) fills it round by round and its plan reads it live, so it is not
    frozen; everyone else reads it."""

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
    decode_tokens: int = 0  # the new tokens after the first (the prefill's): what the rounds produced

    def record_round(self, proposed: int, accepted: int, draft_steps: int = 0) -> None:
        self.rounds += 1
        self.proposed += proposed
        self.accepted += accepted
        self.proposed_lengths.append(proposed)
        self.accept_lengths.append(accepted)
        self.draft_steps.append(draft_steps)
        _grow(self.position_judged, min(proposed, accepted + 1))
        _grow(self.position_accepted, accepted)

    def finish(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.decode_tokens = max(new_tokens - 1, 0)

    @classmethod
    def pooled(cls, records: Iterable[GenerationStats]) -> GenerationStats:
        """The record of several generations together: counts and times summed, rounds in order,
        positions added up; its figures are then pooled ones (e.g. acceptance over all guesses)."""
        out = cls(times={})
        for r in records:
            for name in ("rounds", "target_calls", "draft_calls", "proposed", "accepted", "new_tokens",
                         "decode_tokens"):
                setattr(out, name, getattr(out, name) + getattr(r, name))
            out.accept_lengths += r.accept_lengths
            out.proposed_lengths += r.proposed_lengths
            out.draft_steps += r.draft_steps
            _add(out.position_judged, r.position_judged)
            _add(out.position_accepted, r.position_accepted)
            for phase, seconds in r.times.items():
                out.times[phase] = out.times.get(phase, 0.0) + seconds
        return out

    @property
    def drafts(self) -> int:
        """Rounds that proposed at least one token (vLLM's num_drafts)."""
        return sum(1 for n in self.proposed_lengths if n)

    @property
    def rounds_without_proposal(self) -> int:
        return self.rounds - self.drafts

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target call in the decode part (accepted + the target's own)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """[i]: P(guess i+1 accepted | guesses 1..i accepted and guess i+1 proposed); a position
        judged but never accepted counts 0."""
        accepted = self.position_accepted + [0] * (len(self.position_judged) - len(self.position_accepted))
        return [a / j for a, j in zip(accepted, self.position_judged)]

    @property
    def accept_length_histogram(self) -> list[int]:
        """[a]: rounds that accepted a guesses (a round that proposed nothing counts at a = 0)."""
        counts = [0] * (max(self.accept_lengths, default=-1) + 1)
        for a in self.accept_lengths:
            counts[a] += 1
        return counts

    @property
    def prefill_seconds(self) -> float:
        return self.times.get("prefill", 0.0)

    @property
    def decode_seconds(self) -> float:
        """Time after the prefill: every decode round's phases."""
        return decode_seconds(self.times)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: the tokens after the first over the time after the prefill."""
        decode = self.decode_seconds
        return self.decode_tokens / decode if decode > 0 and self.decode_tokens > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON (generate --json's "stats", a bench row's "stats"), with its
        version and the derived figures for readers that do not load it back."""
        return {"version": STATS_VERSION, **asdict(self), **{name: getattr(self, name) for name in DERIVED}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationStats:
        """The record of to_dict's output, or of a bench row of version 1 (the row itself);
        derived figures in `data` are ignored (recomputed), counts it lacks keep their defaults."""
        version = data.get("version", 1)
        if version == 1:
            data = {**data, "new_tokens": data["n_new"]}
        elif version != STATS_VERSION:
            raise SpecdecError(f"speculation stats of version {version}: this specdec reads versions 1 to "
                               f"{STATS_VERSION}; read them with the specdec that wrote them, or a newer one")
        names = {f.name for f in fields(cls)}
        return cls(**{k: _copied(v) for k, v in data.items() if k in names})


def decode_seconds(times: Mapping[str, float]) -> float:
    """The decode part of a phase-time record (GenerationStats.times, or a bench row's times)."""
    return sum(times.get(phase, 0.0) for phase in DECODE_PHASES)


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _grow(counts: list[int], upto: int) -> None:
    counts.extend([0] * (upto - len(counts)))
    for i in range(upto):
        counts[i] += 1


def _add(total: list[int], counts: list[int]) -> None:
    total.extend([0] * (len(counts) - len(total)))
    for i, n in enumerate(counts):
        total[i] += n


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
