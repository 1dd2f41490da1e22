"""`specdec sweep`: does speculation gain or lose as the context grows?

For each context length: a real long prompt (longprompt.py) is prefilled once into the target's
and the draft's caches; C_T(1), C_D and C_V(k) are timed over that cache; then plain decoding and
each speculative method generate from it (reusing the prefilled prefix, interleaved, repeated),
giving measured speedups, acceptance, and the cost model's prediction from the timed terms. KV
memory is reported by formula and as held by the cache tensors, with the process's peak memory.

One row per context goes to results.jsonl as soon as it is done, so an interrupted sweep resumes at
the next context.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..cost.model import Costs, predicted_speedup, prediction_error
from ..errors import SpecdecError
from ..fmt import table
from ..methods.spec import Method
from .calibration import Calibration


@dataclass(frozen=True)
class SweepSettings:
    contexts: tuple[int, ...] = (2048, 4096, 8192)
    methods: tuple[Method, ...] = ()  # draft and lookup methods (specdec.methods.spec)
    # Fields with a help text are `specdec sweep` options too (cli.options.add_settings), each >= 1.
    tokens: int = field(default=32, metadata={"help": "new tokens per generation (at least 2: the first comes "
                                                      "from the prefill)"})
    repeats: int = field(default=2, metadata={"help": "generations per method and context (after a warm-up)"})
    ks: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    timing_repeats: int = 3


def check_methods(methods: list[Method]) -> None:
    """The sweep runs every method on one prefilled target cache and predicts each from the
    timed k-token terms: plain draft and lookup methods only."""
    for m in methods:
        extra = [o for o in ("conf", "pay", "width", "cat") if getattr(m, o)]
        if m.kind not in ("draft", "lookup") or extra:
            raise SpecdecError(f"sweep runs draft:k=K[:quant=Q][:vocab=N] and lookup:k=K[:ngram=N] methods, "
                               f"not {m.label}")


def sweep_context(target, drafts, tokenizer, n: int, settings: SweepSettings,
                  progress: Callable[[str], None] = lambda _: None) -> dict:
    """Everything measured at one context length, as a JSON-ready row. `drafts`
    (specdec.methods.build.Drafts, reuse_caches=True) holds one cache per draft variant, so each is
    prefilled once and every method's generations reuse it."""
    import torch

    from ..decode.engine import generate
    from ..runtime.choose import runtime_of
    from ..machine import PeakMemory
    from ..methods.build import build_proposer
    from ..prompts.long import long_prompt
    from .measure import kv_bytes, measure_model, measured_kv_bytes

    memory = PeakMemory(target.device)
    memory.reset()
    ids = torch.tensor(long_prompt(tokenizer, n), device=target.device)
    draft_methods = {m.family().label: m for m in settings.methods if m.uses_draft}
    lms = {"target": runtime_of(target)} | {name: drafts.lm(m) for name, m in draft_methods.items()}
    prefill = {}
    for name, lm in lms.items():
        progress(f"{n}: prefill {name}")
        start = time.perf_counter()
        lm.prefill(ids)
        prefill[name] = time.perf_counter() - start
    kv = {name: {"formula": kv_bytes(lm, n), "measured": measured_kv_bytes(lm),
                 "allocated": measured_kv_bytes(lm, allocated=True)} for name, lm in lms.items()}
    progress(f"{n}: timing C_T, C_V(k), C_D")
    ks = sorted({*settings.ks, *(m.k for m in settings.methods)})  # every method's k is timed
    t_costs = measure_model(lms["target"], ids, [k + 1 for k in ks], settings.timing_repeats)
    c_draft = {name: measure_model(lms[name], ids, [1], settings.timing_repeats).step for name in draft_methods}

    runs: dict[Method, list] = {Method("ar"): [], **{m: [] for m in settings.methods}}
    for repeat in range(settings.repeats + 1):  # repeat 0 is a short warm-up, discarded
        for method in runs:
            progress(f"{n}: {method.label} (repeat {repeat}/{settings.repeats})")
            result = generate(lms["target"], ids, drafter=build_proposer(method, drafts),
                              max_new_tokens=settings.tokens if repeat else 4, eos_token_id=[], reuse_prefix=True)
            if repeat:
                runs[method].append(result)
    row = {
        "context": n, "prefill_s": prefill, "kv_bytes": kv,
        "c_target": t_costs.step, "c_draft": c_draft,  # by draft variant (Method.family)
        "verify": {str(k): t_costs.verify(k) for k in ks},  # str: as JSON reads it back
        "methods": _method_summaries(runs, t_costs, c_draft, ks),
    }
    row["peak_memory_bytes"] = memory.read()
    row["peak_memory_kind"] = memory.kind
    return row


def _method_summaries(runs: dict[Method, list], t_costs, c_draft: dict[str, float], ks) -> dict:
    """Measured tok/s, paired speedup over ar (medians over repeats), acceptance, prediction."""
    ar = runs[Method("ar")]
    ar_cal = Calibration.from_stats([r.stats for r in ar])
    out = {}
    for method, results in runs.items():
        cal = Calibration.from_stats([r.stats for r in results])
        speedups = [r.stats.tokens_per_s / a.stats.tokens_per_s for a, r in zip(ar, results)]
        entry = {
            "tokens_per_s": statistics.median(r.stats.tokens_per_s for r in results),
            "speedup": statistics.median(speedups),
            "equal_to_ar": all(r.new_tokens == a.new_tokens for a, r in zip(ar, results)),
        }
        if method.speculative:
            drafting = method.uses_draft
            overhead = cal.overhead_per_round + (0.0 if drafting else cal.propose_per_round)
            costs = Costs(t_costs.step, c_draft[method.family().label] if drafting else 0.0,
                          {q: t_costs.verify(q) for q in ks}, overhead, ar_cal.overhead_per_round)
            predicted = predicted_speedup(costs, cal.acceptance, method.k)
            entry |= {
                "mean_accepted_length": statistics.mean(r.stats.mean_accepted_length for r in results),
                "acceptance_rate": cal.acceptance_rate, "position_acceptance": list(cal.acceptance.rates),
                "hit_rate": cal.acceptance.hit_rate, "expected_tokens": cal.acceptance.at_k(method.k).expected_tokens,
                "predicted_speedup": predicted, "prediction_error": prediction_error(predicted, entry["speedup"]),
            }
        out[method.label] = entry
    return out


def render_table(rows_in: list[dict]) -> str:
    """Markdown table: one line per context."""
    methods = [m for m in rows_in[0]["methods"] if m != "ar"] if rows_in else []
    head = ["context", "C_T ms", "ar step ms (in generation)", "C_D ms", "C_V(2) ms", "C_V(4) ms", "ar tok/s",
            *[f"{m}: speedup (predicted), E[L], acceptance" for m in methods], "KV target+draft MiB", "peak GiB"]
    ms = lambda x: "-" if x is None else f"{1e3 * x:.0f}"
    rows = []
    for r in rows_in:
        ar = r["methods"]["ar"]["tokens_per_s"]
        drafts = " / ".join(f"{ms(c)} ({name})" for name, c in r["c_draft"].items()) or "-"
        cells = [str(r["context"]), ms(r["c_target"]), ms(1 / ar), drafts, ms(r["verify"].get("2")),
                 ms(r["verify"].get("4")), f"{ar:.2f}"]
        for m in methods:
            e = r["methods"][m]
            eq = "" if e["equal_to_ar"] else " (output differs!)"
            cells.append(f"{e['speedup']:.2f}x ({e['predicted_speedup']:.2f}x), {e['mean_accepted_length']:.2f}, "
                         f"{100 * e['acceptance_rate']:.0f}%{eq}")
        kv = sum(v["measured"] for v in r["kv_bytes"].values()) / 2**20
        rows.append(cells + [f"{kv:.0f}", f"{r['peak_memory_bytes'] / 2**30:.2f}"])
    return "\n".join(table(head, rows))


def plot(rows: list[dict], path: Path) -> None:
    """Cost terms (ms) and speedups against context length, side by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs = [r["context"] for r in rows]
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot(xs, [1e3 * r["c_target"] for r in rows], "o-", label="C_T(1) target step")
    for name in rows[0]["c_draft"]:
        left.plot(xs, [1e3 * r["c_draft"][name] for r in rows], "o-", label=f"C_D {name} step")
    for k in ("2", "4", "8"):
        if k in rows[0]["verify"]:
            left.plot(xs, [1e3 * r["verify"][k] for r in rows], "o--", label=f"C_V({k})")
    left.set(xlabel="context tokens", ylabel="ms per forward", title="cost terms")
    left.legend(fontsize=8)
    for m in [m for m in rows[0]["methods"] if m != "ar"]:
        line, = right.plot(xs, [r["methods"][m]["speedup"] for r in rows], "o-", label=f"{m} measured")
        right.plot(xs, [r["methods"][m]["predicted_speedup"] for r in rows], "x:", color=line.get_color(),
                   label=f"{m} predicted")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xlabel="context tokens", ylabel="speedup over plain decoding", title="speedup")
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110, format="png")
