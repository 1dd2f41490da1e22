"""`specdec advise`: measure every term of the cost model on this machine and say which proposer
and k to use, or that speculation does not pay here and why.

Steps: copy bandwidth; C_T(1) and C_V(k) for k = 1..k_max at the chosen context; the draft's
step C_D; acceptance by position of each proposer on a small calibration set (greedy, proposing
calibration_k tokens a round); then the cost model's optimal k per proposer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .costmodel import (
    Acceptance, Costs, break_even_alpha, expected_accepted_iid, fit_alpha, optimal_k, predicted_speedup,
)
from .errors import SpecdecError

# A decode step that reads memory at this share of the copy bandwidth or more is bandwidth-bound:
# guesses then ride along almost free in a verify block.
BANDWIDTH_BOUND = 0.5
# Below this predicted speedup the advice is "don't speculate": the model's error (docs/bench) is
# of this order, so a smaller gain is not worth the second model's memory.
MIN_GAIN = 1.05


BOUND_TEXT = {
    "bandwidth": "Decode is bandwidth-bound here, and blocks ride along almost free",
    "mixed": "A decode step is bandwidth-bound here, but blocks of guesses run out of compute",
    "compute": "Decode is compute-bound here",
}


@dataclass(frozen=True)
class AdviseSettings:
    context: int = 512
    k_max: int = 16
    calibration_k: int = 6
    prompts: int = 4
    tokens: int = 48
    repeats: int = 3


@dataclass(frozen=True)
class Calibration:
    """What one proposer did on the calibration prompts."""

    acceptance: Acceptance
    histogram: list[int]  # rounds by accepted length 0..k, rounds that guessed
    acceptance_rate: float  # accepted / proposed: the naive i.i.d. alpha most tools report
    propose_per_round: float  # seconds
    overhead_per_round: float  # seconds outside propose and verify
    tokens_per_s: float

    @classmethod
    def from_stats(cls, stats: Sequence) -> Calibration:
        judged = _sum_lists([s.position_judged for s in stats])
        accepted = _sum_lists([s.position_accepted for s in stats])
        accepted += [0] * (len(judged) - len(accepted))  # positions judged but never accepted
        rates = [a / j for a, j in zip(accepted, judged) if j > 0]
        # A generation's last round may be left no room to guess (max_new_tokens); that is no miss.
        rounds_of = [_without_empty_last(s) for s in stats]
        proposed = [n for pairs in rounds_of for n, _ in pairs]
        lengths = [a for pairs in rounds_of for n, a in pairs if n > 0]
        rounds = max(1, sum(s.rounds for s in stats))
        hit = sum(n > 0 for n in proposed) / len(proposed) if proposed else 0.0
        decode = sum(sum(t for p, t in s.times.items() if p != "prefill") for s in stats)
        return cls(
            acceptance=Acceptance(tuple(rates), hit),
            acceptance_rate=sum(s.accepted for s in stats) / max(1, sum(s.proposed for s in stats)),
            histogram=np.bincount(lengths, minlength=len(rates) + 1).tolist() if lengths else [],
            propose_per_round=sum(s.times["propose"] for s in stats) / rounds,
            overhead_per_round=sum(s.times["accept"] + s.times["other"] for s in stats) / rounds,
            tokens_per_s=sum(s.new_tokens - 1 for s in stats) / decode if decode else 0.0,
        )


    @classmethod
    def from_saved(cls, saved: dict, overhead_per_round: float) -> Calibration:
        """A proposer's calibration from the JSON of another advise run (its acceptance, measured
        where the weights are), with this machine's bookkeeping overhead per round."""
        rates = tuple(float(r) for r in saved["rates"])
        return cls(
            acceptance=Acceptance(rates, float(saved["hit_rate"])),
            histogram=list(saved.get("histogram", [])),
            acceptance_rate=float(saved.get("acceptance_rate", sum(rates) / max(1, len(rates)))),
            propose_per_round=float(saved.get("propose_per_round", 0.0)),
            overhead_per_round=overhead_per_round,
            tokens_per_s=0.0,
        )


def _without_empty_last(stats) -> list[tuple[int, int]]:
    """(proposed, accepted) per round, without a final round that proposed nothing."""
    pairs = list(zip(stats.proposed_lengths, stats.accept_lengths))
    return pairs[:-1] if pairs and pairs[-1][0] == 0 else pairs


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for values in lists:
        out.extend([0] * (len(values) - len(out)))
        for i, v in enumerate(values):
            out[i] += v
    return out


def recommend(
    c_target: float, verify: dict[int, float], repair: float, baseline_overhead: float,
    proposers: dict[str, tuple[float, Calibration]], k_max: int,
) -> dict:
    """Per proposer (name -> (C_D per guess, calibration)): predicted speedup for every k, the
    best k, break-even acceptance; then the overall choice or "don't speculate" with the reason."""
    per = {}
    for name, (c_draft, cal) in proposers.items():
        # A model-free proposer's search time is per round, not per guess: charge it as overhead.
        per_guess = c_draft
        overhead = cal.overhead_per_round + (cal.propose_per_round if c_draft == 0 else 0.0)
        costs = Costs(c_target, per_guess, verify, repair, overhead, baseline_overhead)
        if not cal.acceptance.rates:
            per[name] = {"k": 0, "speedup": None, "reason": "it never proposed a token on the calibration prompts"}
            continue
        curve = {k: predicted_speedup(costs, cal.acceptance, k) for k in range(1, k_max + 1)}
        best_k, best = optimal_k(costs, cal.acceptance, k_max)
        alpha = fit_alpha(cal.acceptance)
        per[name] = {
            "k": best_k, "speedup": best, "speedup_by_k": curve,
            "alpha_fitted": alpha, "hit_rate": cal.acceptance.hit_rate,
            "break_even_alpha": {k: break_even_alpha(costs, k) for k in (1, 2, 4, 8) if k <= k_max},
            "reason": _reason(name, costs, cal, alpha, best_k, best),
        }
    ranked = sorted((v["speedup"], n) for n, v in per.items() if v["speedup"] is not None)
    if ranked and ranked[-1][0] >= MIN_GAIN:
        speedup, name = ranked[-1]
        choice = {"proposer": name, "k": per[name]["k"], "predicted_speedup": speedup}
    else:
        choice = {"proposer": "none", "k": 0, "predicted_speedup": 1.0}
    return {"proposers": per, "choice": choice}


def _reason(name: str, costs: Costs, cal: Calibration, alpha: float, k: int, speedup: float) -> str:
    """Which term decides, in one sentence."""
    ratio = costs.c_draft / costs.c_target
    v2 = costs.verify(2) / costs.c_target
    if k and speedup >= MIN_GAIN:
        return (f"E[tokens/round] {cal.acceptance.at_k(k).expected_tokens:.2f} at k={k} outweighs a round cost of "
                f"{k * ratio + costs.verify(k) / costs.c_target:.2f} target steps")
    if ratio > 0 and costs.c_draft >= 0.5 * costs.c_target:
        return f"each guess costs {ratio:.2f} of a target step: the draft is too expensive"
    if v2 > 1.5:
        return f"verifying 2 guesses costs {v2:.2f} target steps: blocks are not free on this machine"
    be = break_even_alpha(costs, 1)
    return (f"acceptance is too low: fitted alpha {alpha:.2f} (hit rate {cal.acceptance.hit_rate:.2f}), "
            f"break-even at k=1 is {be if be is None else round(be, 2)}")


def bandwidth_verdict(decode_bytes: int, c_target: float, copy_bytes_per_s: float,
                      verify: dict[int, float]) -> dict:
    """Is one decode step limited by memory bandwidth or by compute on this machine?"""
    used = decode_bytes / c_target
    share = used / copy_bytes_per_s
    growth = verify.get(4, max(verify.values())) / c_target
    if share < BANDWIDTH_BOUND:
        bound = "compute"
    else:  # the step streams memory; whether blocks ride along depends on the compute left
        bound = "bandwidth" if growth < 1.5 else "mixed"
    return {"bytes_per_step": decode_bytes, "bytes_per_s": used, "copy_bytes_per_s": copy_bytes_per_s,
            "share_of_copy_bandwidth": share, "verify4_over_step": growth, "bound": bound}


def run_advise(target, draft, tokenizer, settings: AdviseSettings, prompts: list[list[int]],
               progress: Callable[[str], None] = lambda _: None, saved: dict | None = None) -> dict:
    """Measure everything and return the report as a JSON-ready dict.

    With `saved` (the JSON of an advise run elsewhere) the proposers' acceptance comes from it
    and only the costs are measured here: the models may then carry random weights, and
    `tokenizer` may be None (the timed context is then random token ids)."""
    import copy

    import torch

    from .engine import generate
    from .lm import CausalLM, logit_width
    from .quantize import int8_draft
    from .longprompt import long_prompt
    from .measure import copy_bandwidth, decode_bytes, kv_bytes, measure_model, weight_bytes
    from .proposers import DraftModel, PromptLookup

    progress("copy bandwidth")
    bandwidth = copy_bandwidth(device=target.device)
    if tokenizer is None:  # random weights: the values of the context's tokens cost nothing
        ids = torch.randint(logit_width(target), (settings.context,), generator=torch.Generator().manual_seed(0))
    else:
        ids = torch.tensor(long_prompt(tokenizer, settings.context))
    context = ids.to(target.device)
    progress(f"target C_T(1), C_V(k) for k=1..{settings.k_max} at context {settings.context}")
    t_lm = CausalLM(target)
    t_costs = measure_model(t_lm, context, range(1, settings.k_max + 2), settings.repeats)
    verify = {k: t_costs.verify(k) for k in range(1, settings.k_max + 1)}
    drafts = {}
    if draft is not None:  # a draft loaded with --draft-int8 is already the int8 candidate
        drafts["draft" if _has_float_layers(draft) else "draft-int8"] = draft
        if draft.device.type == "cpu" and _has_float_layers(draft):
            drafts["draft-int8"] = int8_draft(copy.deepcopy(draft))  # the CPU's cheaper draft
    d_costs = {}
    for name, model in drafts.items():
        progress(f"{name} C_D")
        d_costs[name] = measure_model(CausalLM(model), context, [1, 2], settings.repeats)
    t_lm.reset()

    def calibrate(drafter) -> Calibration:
        stats = [generate(target, p, drafter=drafter, max_new_tokens=settings.tokens).stats for p in prompts]
        return Calibration.from_stats(stats)

    progress(f"plain decoding on {len(prompts)} calibration prompts")
    plain = calibrate(None)
    candidates = {}
    if saved is not None:
        found = saved.get("calibration", {})
        for name in [*drafts, "lookup"]:
            if name in found:
                candidates[name] = (d_costs[name].step if name in d_costs else 0.0,
                                    Calibration.from_saved(found[name], plain.overhead_per_round))
        if not candidates:
            raise SpecdecError("the acceptance file has no calibration of draft, draft-int8 or lookup")
    else:
        for name, model in drafts.items():
            progress(f"{name} proposer, k={settings.calibration_k}")
            candidates[name] = (d_costs[name].step, calibrate(DraftModel(model, settings.calibration_k)))
        progress(f"lookup proposer, k={settings.calibration_k}")
        candidates["lookup"] = (0.0, calibrate(PromptLookup(settings.calibration_k)))

    advice = recommend(t_costs.step, verify, 0.0, plain.overhead_per_round, candidates, settings.k_max)
    c_draft = next(iter(d_costs.values())).step if d_costs else None
    models = {"target": target} | ({"draft": draft} if draft is not None else {})
    memory = {name: {"weights": weight_bytes(m), "kv_cache": kv_bytes(m, settings.context)}
              for name, m in models.items()}
    return {
        "settings": settings.__dict__,
        "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."),
        "c_draft": c_draft, "draft_over_target": c_draft / t_costs.step if c_draft else None,
        "c_target": t_costs.step,
        "c_draft_int8": d_costs["draft-int8"].step if "draft-int8" in d_costs else None,
        "verify": verify, "verify_over_step": {k: v / t_costs.step for k, v in verify.items()},
        "plain_tokens_per_s": plain.tokens_per_s,
        "bandwidth": bandwidth_verdict(decode_bytes(target, settings.context), t_costs.step, bandwidth, verify),
        "memory": memory, "memory_total": sum(sum(m.values()) for m in memory.values()),
        "acceptance_from": "saved" if saved is not None else "measured",
        "calibration": {name: {"rates": list(c.acceptance.rates), "hit_rate": c.acceptance.hit_rate,
                               "histogram": c.histogram, "tokens_per_s": c.tokens_per_s,
                               "acceptance_rate": c.acceptance_rate, "propose_per_round": c.propose_per_round,
                               "expected_tokens_measured": c.acceptance.expected_tokens,
                               "expected_tokens_iid": _iid_tokens(c)}
                        for name, (_, c) in candidates.items()},
        **advice,
    }


def _has_float_layers(model) -> bool:
    """Not yet quantized: its output layer is a plain float Linear."""
    import torch

    return isinstance(model.get_output_embeddings(), torch.nn.Linear)


def _iid_tokens(c: Calibration) -> float | None:
    """E[A]+1 by the textbook i.i.d. formula with alpha = accepted/proposed, the one number most
    tools report; it ignores that later guesses are accepted less often than the first."""
    if not c.acceptance.rates:
        return None
    return c.acceptance.hit_rate * expected_accepted_iid(c.acceptance_rate, c.acceptance.k) + 1.0


def render(report: dict) -> str:
    """The practical answers, in plain text."""
    gib = 2**30
    bw = report["bandwidth"]
    lines = [
        f"specdec advise: {report['dtype']} on {report['device']}, context {report['settings']['context']} tokens",
        "",
        f"1. {BOUND_TEXT[bw['bound']]}: a target step reads {bw['bytes_per_step'] / gib:.2f} GiB in "
        f"{report['c_target'] * 1e3:.0f} ms = {bw['bytes_per_s'] / 1e9:.1f} GB/s, "
        f"{100 * bw['share_of_copy_bandwidth']:.0f}% of the measured copy bandwidth "
        f"({bw['copy_bytes_per_s'] / 1e9:.1f} GB/s); a 4-guess verify block costs {bw['verify4_over_step']:.2f} steps.",
    ]
    if report["c_draft"] is not None:
        int8 = report.get("c_draft_int8")
        lines.append(f"2. The draft costs {report['c_draft'] * 1e3:.0f} ms a token = "
                     f"{report['draft_over_target']:.2f} of a target step"
                     + (f"; with int8 layers {int8 * 1e3:.0f} ms = {int8 / report['c_target']:.2f}." if int8 else "."))
    else:
        lines.append("2. No draft model given: only prompt lookup was measured.")
    lines.append("3. Acceptance " + ("from the saved run given with --acceptance (not measured here):"
                                     if report.get("acceptance_from") == "saved"
                                     else "on the calibration prompts (greedy):"))
    for name, c in report["calibration"].items():
        rates = " ".join(f"{r:.2f}" for r in c["rates"])
        lines.append(f"   {name}: by position [{rates}], rounds that guessed {100 * c['hit_rate']:.0f}%, "
                     f"accepted-length histogram {c['histogram']}, E[tokens/round] "
                     f"{c['expected_tokens_measured']:.2f} (i.i.d. alpha model: {_num(c['expected_tokens_iid'])})")
    grow = report["verify_over_step"]
    lines.append("4. C_V(k) in target steps: " + ", ".join(f"k={k}: {v:.2f}" for k, v in grow.items()))
    mem = report["memory"]
    parts = ", ".join(f"{n} {m['weights'] / gib:.2f} GiB weights + {m['kv_cache'] / gib:.3f} GiB KV"
                      for n, m in mem.items())
    lines.append(f"5. Memory: {parts}; total {report['memory_total'] / gib:.2f} GiB")
    lines.append(f"6. Predicted speedup over plain decoding ({report['plain_tokens_per_s']:.2f} tok/s measured):")
    for name, p in report["proposers"].items():
        if p["speedup"] is None:
            lines.append(f"   {name}: {p['reason']}")
            continue
        curve = ", ".join(f"k={k}: {s:.2f}" for k, s in p["speedup_by_k"].items() if int(k) <= 8)
        lines.append(f"   {name}: best k={p['k']} -> {p['speedup']:.2f}x ({curve}); {p['reason']}")
    choice = report["choice"]
    if choice["proposer"] == "none":
        lines.append(f"Recommendation: speculation does not pay here (no proposer reaches {MIN_GAIN:.2f}x); "
                     "use plain decoding (--proposer none).")
    else:
        flags = "draft --draft-int8" if choice["proposer"] == "draft-int8" else choice["proposer"]
        lines.append(f"Recommendation: --proposer {flags} -k {choice['k']} "
                     f"(predicted {choice['predicted_speedup']:.2f}x).")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
