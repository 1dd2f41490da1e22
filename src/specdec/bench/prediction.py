"""The cost model fed with a bench group's own measurements (summary NOTES["prediction"]):
what it predicts against the measured speedup, and where a decode token's time goes."""

from __future__ import annotations

import numpy as np

from ..cost.model import Acceptance, Costs, predicted_speedup, prediction_error
from ..decode.stats import DECODE_PHASES, GenerationStats
from ..methods.spec import Method
from .row import engine_stats


def time_per_token(rows: list[dict]) -> dict | None:
    tokens = sum(r["decode_tokens"] for r in rows)
    if tokens <= 0:
        return None
    phases = DECODE_PHASES if "verify" in rows[0]["times"] else ()  # HF's decode is one undivided span
    split = {phase: _total(rows, phase) / tokens for phase in phases}
    return {**split, "decode": sum(r["decode_s"] for r in rows) / tokens}


def _draft_call_time(s: GenerationStats, runs: int) -> float:
    """Propose time per decode draft call; begin() runs one draft forward over the prompt per
    generation, charged to prefill, so it is not counted."""
    decode_calls = s.draft_calls - runs
    return s.times["propose"] / decode_calls if decode_calls > 0 else 0.0


def prediction(rows: list[dict], baseline: list[dict], method: Method, speedup: dict) -> dict | None:
    """The cost model's speedup from this group's measured costs (see NOTES["prediction"]);
    rows and baseline are specdec's (the engine's records, pooled)."""
    s = GenerationStats.pooled(engine_stats(r) for r in rows)
    base = GenerationStats.pooled(engine_stats(r) for r in baseline)
    if not base.rounds or not s.rounds:
        return None
    k, rounds, t = method.k, s.rounds, s.times
    c_target = base.times["verify"] / base.rounds
    if c_target <= 0:
        return None
    c_verify = t["verify"] / rounds
    # The model charges k * C_D a round; fed the propose time per round / k, it charges what the
    # rounds spent, also where they guess fewer than k. The C_D shown is per draft call.
    propose_per_slot = t["propose"] / (rounds * k)
    c_draft = _draft_call_time(s, len(rows)) if method.uses_draft else propose_per_slot
    costs = Costs(
        c_target=c_target,
        c_draft=propose_per_slot,
        c_verify={k: c_verify},
        c_overhead=(t["accept"] + t["other"]) / rounds,
        c_baseline_overhead=sum(base.times[p] for p in ("propose", "accept", "other")) / base.rounds,
    )
    acceptance = Acceptance.from_histogram(np.bincount(s.accept_lengths, minlength=k + 1))
    predicted = predicted_speedup(costs, acceptance, k)
    measured = speedup["geomean"]
    return {
        "predicted_speedup": predicted,
        "measured_speedup": measured,
        "measured_as": "geomean of per-prompt paired speedups",
        "relative_error": prediction_error(predicted, measured),
        "inputs": {
            "k": k,
            "c_target": c_target,
            "c_draft": c_draft,
            "c_verify": c_verify,
            "mean_block_size": 1 + s.proposed / rounds,
            "c_overhead": costs.c_overhead,
            "c_baseline_overhead": costs.c_baseline_overhead,
            "rates": list(acceptance.rates),
            "expected_tokens_per_round": acceptance.expected_tokens,
        },
    }


def _total(rows: list[dict], phase: str) -> float:
    return sum(r["times"][phase] for r in rows)
