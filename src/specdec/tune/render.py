"""An advice record (specdec.tune.advice.Advice) as the practical answers, in plain text."""

from __future__ import annotations

from ..cost.model import Rounds
from ..fmt import num
from ..methods.spec import parse
from .advice import Advice
from .advise import MIN_GAIN

BOUND_TEXT = {
    "bandwidth": "Decode is bandwidth-bound here, and blocks ride along almost free",
    "mixed": "A decode step is bandwidth-bound here, but blocks of guesses run out of compute",
    "compute": "Decode is compute-bound here",
}
GIB = 2**30


def _share(bw: dict) -> str:
    copy = f"{bw['copy_bytes_per_s'] / 1e9:.1f} GB/s"
    if "read_bytes_per_s" not in bw:  # advice files written before the read bandwidth was measured
        return f"{100 * bw['share_of_copy_bandwidth']:.0f}% of the measured copy bandwidth ({copy})"
    return (f"{100 * bw['share_of_read_bandwidth']:.0f}% of the measured read bandwidth "
            f"({bw['read_bytes_per_s'] / 1e9:.1f} GB/s; a copy moves {copy}, read + write)")


def render(advice: Advice) -> str:
    bw = advice.bandwidth
    target = (advice.environment.get("quant") or {})
    form = f", target {target['target']} ({target.get('target_reason', 'as --target-quant says')})" if target else ""
    lines = [
        f"specdec advise: {advice.dtype} on {advice.device}, context {advice.settings['context']} tokens{form}",
        "",
        f"1. {BOUND_TEXT[bw['bound']]}: a target step reads {bw['bytes_per_step'] / GIB:.2f} GiB in "
        f"{advice.c_target * 1e3:.0f} ms = {bw['bytes_per_s'] / 1e9:.1f} GB/s, "
        f"{_share(bw)}; a 4-guess verify block costs {bw['verify4_over_step']:.2f} steps.",
    ]
    if advice.c_draft:
        costs = [f"{name} {c * 1e3:.0f} ms = {c / advice.c_target:.2f}" for name, c in advice.c_draft.items()]
        lines.append(f"2. A draft step costs (ms, and in target steps): {'; '.join(costs)}.")
    else:
        lines.append("2. No draft model given: only prompt lookup was measured.")
    lines.append("3. Acceptance " + ("from the saved run given with --acceptance (not measured here):"
                                     if advice.acceptance_from == "saved" else "on the calibration prompts (greedy):"))
    for name, c in advice.calibration.items():
        rates = " ".join(f"{r:.2f}" for r in c.rates)
        lines.append(f"   {name}: by position [{rates}], rounds that guessed {100 * c.hit_rate:.0f}%, "
                     f"accepted-length histogram {list(c.histogram)}, E[tokens/round] "
                     f"{c.expected_tokens_measured:.2f} (i.i.d. alpha model: {num(c.expected_tokens_iid)})"
                     + _rounds(c.rounds))
    lines.append("4. C_V(k) in target steps: "
                 + ", ".join(f"k={k}: {v / advice.c_target:.2f}" for k, v in advice.verify.items()))
    parts = ", ".join(f"{n} {m['weights'] / GIB:.2f} GiB weights + {m['kv_cache'] / GIB:.3f} GiB KV"
                      for n, m in advice.memory.items())
    total = sum(sum(m.values()) for m in advice.memory.values())
    lines.append(f"5. Memory: {parts}; total {total / GIB:.2f} GiB")
    lines.append(f"6. Predicted speedup over plain decoding ({advice.plain_tokens_per_s:.2f} tok/s measured):")
    for name, p in advice.proposers.items():
        if p.speedup is None:
            lines.append(f"   {name}: {p.reason}")
            continue
        curve = ", ".join(f"k={k}: {s:.2f}" for k, s in p.speedup_by_k.items() if k <= 8)
        lines.append(f"   {name}: best k={p.k} -> {p.speedup:.2f}x ({curve}); {p.reason}")
    lines += _confirmed(advice) + _llamacpp(advice.llamacpp)
    if advice.not_ranked:
        lines.append("Not ranked: " + "; ".join(f"{name}: {why}" for name, why in advice.not_ranked.items()))
    choice = advice.choice
    if parse(choice.method).kind == "ar":
        lines.append(f"Recommendation: speculation does not pay here (no proposer reaches {MIN_GAIN:.2f}x); "
                     "use plain decoding (--proposer none).")
    else:
        measured = f", measured {choice.measured_speedup:.2f}x" if choice.measured_speedup else ""
        lines.append(f"Recommendation: --proposer {choice.method} (predicted {choice.predicted_speedup:.2f}x{measured}"
                     f"{'; ' + choice.reason if choice.reason else ''}).")
    return "\n".join(lines)


def _rounds(rounds: Rounds | None) -> str:
    if rounds is None:  # a record from before version 4
        return ""
    return (f"; a round: {rounds.draft_steps:.2f} draft steps, {rounds.nodes:.2f} tokens verified, "
            f"{rounds.tokens:.2f} committed")


def _confirmed(advice: Advice) -> list[str]:
    if not advice.confirmed:
        return []
    lines = ["7. Confirmed, paired with plain decoding on the calibration prompts (predicted -> measured):"]
    for c in advice.confirmed:
        lines.append(f"   {c.method}: {c.predicted_speedup:.2f}x -> {c.measured_speedup:.2f}x "
                     f"({c.tokens_per_s:.2f} against {c.plain_tokens_per_s:.2f} tok/s, {c.prompts} prompts x {c.tokens} tokens)")
    return lines


def _llamacpp(record: dict) -> list[str]:
    if "not_timed" in record:
        return [f"llama.cpp: not timed ({record['not_timed']})."]
    if not record.get("tokens_per_s"):
        return []
    return [f"llama.cpp's plain decoding of {record['gguf']}: {record['tokens_per_s']:.2f} tok/s; specdec's plain "
            f"decoding {record['plain_over_llamacpp']:.2f}x it, the choice {record['choice_over_llamacpp']:.2f}x "
            f"({record['choice_from']})."]
