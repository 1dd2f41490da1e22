"""Acceptance as a server reports it, for the summary: llama.cpp's `timings` per request, or the
differences of vLLM's /metrics counters (specdec.external.endpoints.metrics). Reads only rows."""

from __future__ import annotations


def server_acceptance(rows: list[dict]) -> dict:
    """What a server reported: llama.cpp's draft_n/draft_n_accepted per request (no round count,
    so no mean accepted length), or vLLM's counter differences (drafts are rounds)."""
    counted = [r for r in rows if r.get("proposed") is not None]
    proposed = sum(r["proposed"] for r in counted)
    accepted = sum(r["accepted"] for r in counted)
    drafts = sum(r.get("drafts") or 0 for r in counted)
    per_position = [r["accepted_per_position"] for r in counted if r.get("accepted_per_position")]
    depth = max(map(len, per_position), default=0)
    pooled = [sum(p[i] for p in per_position if i < len(p)) for i in range(depth)]
    return {
        "accept_source": counted[0]["accept_source"] if counted else None,
        "rounds": drafts or None,
        "mean_accepted_length": (accepted + drafts) / drafts if drafts else None,
        "acceptance_rate": accepted / proposed if proposed else None,
        "position_acceptance": position_rates(drafts, pooled) if drafts and pooled else None,
        "accept_length_histogram": [],
        "rounds_without_proposal": None,
    }



def position_rates(drafts: float, per_position: list[float]) -> list[float]:
    """[i]: P(guess i+1 accepted | guesses 1..i accepted), from vLLM's counts: accepted at
    position 0 over drafts, then each position's count over the one before. Exact when every
    draft proposes the same number of tokens (vLLM's num_speculative_tokens): a later position
    is accepted only after all earlier ones."""
    rates, before = [], drafts
    for count in per_position:
        rates.append(count / before if before else 0.0)
        before = count
    return rates
