"""Advise's check of its own prediction: the top few methods run paired with plain decoding.

Each method and plain decoding generate on the same prompts, interleaved (A then B on one prompt,
B then A on the next), so a slow spell of a shared machine hits both alike; one short generation
of each first warms caches and kernels and is discarded. The measured speedup is the method's
decode tokens/s over plain decoding's, each pooled over the prompts (greedy: both commit the same
tokens, so this is the ratio of their decode times).
"""

from __future__ import annotations

from collections.abc import Callable

from ..methods.spec import Method
from ..proposers.policy import PayRule
from .advice import Choice, Confirmed

WARMUP_TOKENS = 8


def confirm(target, drafts, top: list[tuple[Method, float]], prompts: list[list[int]], tokens: int,
            progress: Callable[[str], None] = lambda _: None,
            pay: Callable[[Method], PayRule | None] = lambda _: None) -> list[Confirmed]:
    """Run each (method, predicted speedup) of `top` paired with plain decoding on `prompts`; a
    method with pay=1 stops by `pay`'s rule for it."""
    from ..methods.build import build_proposer

    out = []
    for method, predicted in top:
        progress(f"confirming {method.label} (predicted {predicted:.2f}x) against plain decoding, paired")
        for proposer in (None, build_proposer(method, drafts, pay(method))):  # warm-up, discarded
            _decode(target, prompts[0], proposer, WARMUP_TOKENS)
        totals = {"plain": [0, 0.0], "method": [0, 0.0]}
        for i, prompt in enumerate(prompts):
            order = ("plain", "method") if i % 2 == 0 else ("method", "plain")
            for side in order:
                proposer = None if side == "plain" else build_proposer(method, drafts, pay(method))
                n, seconds = _decode(target, prompt, proposer, tokens)
                totals[side][0] += n
                totals[side][1] += seconds
        rate = {side: n / s if s else 0.0 for side, (n, s) in totals.items()}
        measured = rate["method"] / rate["plain"] if rate["plain"] else 0.0
        out.append(Confirmed(method.label, predicted, measured, rate["method"], rate["plain"], len(prompts), tokens))
    return out


def _decode(target, prompt: list[int], proposer, tokens: int) -> tuple[int, float]:
    """Decode tokens (after the first) and their seconds of one greedy generation."""
    from ..decode.engine import generate

    stats = generate(target, prompt, drafter=proposer, max_new_tokens=tokens).stats
    return stats.decode_tokens, stats.decode_seconds


def confirmed_choice(confirmed: list[Confirmed], min_gain: float) -> Choice:
    """The fastest method as measured, or plain decoding where none measured min_gain."""
    best = max(confirmed, key=lambda c: c.measured_speedup)
    if best.measured_speedup < min_gain:
        return Choice("ar", 1.0, None,
                      reason=f"the best confirmed method, {best.method}, measured {best.measured_speedup:.2f}x, "
                             f"under {min_gain:.2f}x")
    return Choice(best.method, best.predicted_speedup, best.measured_speedup,
                  reason=f"the fastest of the {len(confirmed)} confirmed, measured paired with plain decoding")
