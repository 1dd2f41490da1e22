"""The plots of a bench report (bench.report), each drawn from the summary dict alone into a PNG."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg  # files only: no display needed
from matplotlib.figure import Figure

from ..decode.stats import DECODE_PHASES
from ..files import write_atomic

HF_DECODE = "decode (HF, not split)"


def save_plot(plot: Callable[[Figure, dict], bool], summary: dict, path: Path) -> bool:
    """Draw one plot; False (and no file) when the summary has nothing for it."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    if not plot(fig, summary):
        path.unlink(missing_ok=True)  # a stale plot from an earlier report must not linger
        return False
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return True


def plot_speedup(fig: Figure, summary: dict) -> bool:
    groups = {"overall": summary["overall"]}
    if len(summary["categories"]) > 1:
        groups.update(summary["categories"])
    labels = [label for label, m in summary["overall"]["methods"].items() if m["speedup"]]
    if not labels:
        return False
    ax = fig.add_subplot()
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        xs, ys, errs = [], [], [[], []]
        for i, group in enumerate(groups.values()):
            s = group["methods"].get(label, {}).get("speedup")
            if s:
                xs.append(i + (j - (len(labels) - 1) / 2) * width)
                ys.append(s["median"])
                errs[0].append(s["median"] - s["ci95_median"][0])
                errs[1].append(s["ci95_median"][1] - s["median"])
        ax.errorbar(xs, ys, yerr=errs, fmt="o", capsize=3, label=label)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel("decode speedup over ar (median, 95% CI)")
    ax.legend(fontsize="small")
    return True


def plot_accept_lengths(fig: Figure, summary: dict) -> bool:
    methods = {label: m for label, m in summary["overall"]["methods"].items()
               if m["k"] and m["accept_length_histogram"]}
    if not methods:
        return False
    ax = fig.add_subplot()
    width = 0.8 / len(methods)
    for j, (label, m) in enumerate(methods.items()):
        counts = np.array(m["accept_length_histogram"], dtype=float)
        ax.bar(np.arange(len(counts)) + (j - (len(methods) - 1) / 2) * width, counts / counts.sum(), width, label=label)
    ax.set_xticks(range(max(len(m["accept_length_histogram"]) for m in methods.values())))
    ax.set_xlabel("draft tokens accepted in a round")
    ax.set_ylabel("share of decode rounds")
    ax.legend(fontsize="small")
    return True


def plot_position_acceptance(fig: Figure, summary: dict) -> bool:
    methods = {label: m["position_acceptance"] for label, m in summary["overall"]["methods"].items()
               if m["position_acceptance"]}
    if not methods:
        return False
    ax = fig.add_subplot()
    for label, rates in methods.items():
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
    ax.set_xticks(range(1, max(map(len, methods.values())) + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | earlier ones accepted)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    return True


def plot_time_breakdown(fig: Figure, summary: dict) -> bool:
    methods = {label: m for label, m in summary["overall"]["methods"].items() if m["time_per_token_s"]}
    if not methods:
        return False
    decode, prefill = fig.subplots(1, 2, width_ratios=[3, 1])
    x = np.arange(len(methods))
    bottom = np.zeros(len(methods))
    stacks = [_time_parts(m["time_per_token_s"]) for m in methods.values()]
    for part in (*DECODE_PHASES, HF_DECODE):
        ms = np.array([1000 * stack.get(part, 0.0) for stack in stacks])
        if ms.any():
            decode.bar(x, ms, bottom=bottom, label=part, hatch="//" if part == HF_DECODE else None)
            bottom += ms
    decode.set_xticks(x, list(methods), rotation=30, ha="right", fontsize="small")
    decode.set_ylabel("ms per decode token")
    decode.legend(fontsize="small")
    prefill.bar(x, [m["prefill_s"]["median"] for m in methods.values()], color="grey")
    prefill.set_xticks(x, list(methods), rotation=30, ha="right", fontsize="small")
    prefill.set_ylabel("prefill s (median)")
    return True


def _time_parts(per_token: dict) -> dict:
    # HF methods have one undivided decode span; specdec's splits into its round phases.
    return {p: per_token[p] for p in DECODE_PHASES} if "verify" in per_token else {HF_DECODE: per_token["decode"]}


PLOTS = {  # file name -> the plot drawn into it
    "speedup.png": plot_speedup,
    "accept_lengths.png": plot_accept_lengths,
    "acceptance_by_position.png": plot_position_acceptance,
    "time_breakdown.png": plot_time_breakdown,
}
