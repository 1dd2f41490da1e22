"""The table of serve_sampling.sh's runs: per method (in process and through `specdec serve`,
plain and speculative), decode tokens/s greedy and sampled, each sampled run over greedy per
prompt (greedy: the geometric mean of the two greedy runs that bracket the sampled ones), and
the server over the same method in process (greedy, per prompt within each run). Medians with
95% bootstrap intervals over the prompts (bench's own statistics).

    .venv/bin/python scripts/measure/serve_sampling_table.py docs/serving/sampling-zen4/humaneval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from specdec.bench.store import read_rows  # noqa: E402
from specdec.bench.summary import bootstrap_ci, geomean  # noqa: E402

RUNS = ("greedy", "top-p", "min-p", "greedy-again")
SERVED = {"endpoint:name=plain": "ar"}  # the served plain method's in-process twin; spec's is the other one


def rates(folder: Path) -> dict[str, dict[str, float]]:
    """{method: {prompt: decode tok/s}} of one run (one repeat)."""
    out: dict[str, dict[str, float]] = {}
    for r in read_rows(folder):
        if r["tokens_per_s"]:
            out.setdefault(r["method"], {})[r["prompt_id"]] = r["tokens_per_s"]
    return out


def ratio_cell(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    lo, hi = bootstrap_ci(np.array(ratios), lambda x: np.median(x, axis=1))
    return f"{np.median(ratios):.2f} [{lo:.2f}, {hi:.2f}]"


def table(folder: Path) -> str:
    runs = {name: rates(folder / name) if (folder / name).is_dir() else {} for name in RUNS}
    methods = list(runs["greedy"])
    twin = {**SERVED, "endpoint:name=spec": next(m for m in methods if m not in SERVED and m != "ar"
                                                 and not m.startswith("endpoint"))}
    lines = ["| method | greedy tok/s | top-p tok/s | top-p / greedy | min-p tok/s | min-p / greedy "
             "| served / in process (greedy) |", "|---|---|---|---|---|---|---|"]
    for m in methods:
        greedy = {p: geomean([runs["greedy"][m][p], runs["greedy-again"][m][p]])
                  for p in runs["greedy"][m] if p in runs["greedy-again"].get(m, {})}
        if not greedy:  # one greedy run only
            greedy = runs["greedy"][m]
        cells = [f"{np.median(list(greedy.values())):.1f}"]
        for name in ("top-p", "min-p"):
            sampled = runs[name].get(m, {})
            cells += [f"{np.median(list(sampled.values())):.1f}" if sampled else "-",
                      ratio_cell([sampled[p] / greedy[p] for p in sampled if p in greedy])]
        served = [runs[run][m][p] / runs[run][twin[m]][p] for run in ("greedy", "greedy-again")
                  for p in runs[run].get(m, {}) if m in twin and p in runs[run].get(twin[m], {})]
        cells.append(ratio_cell(served) if m in twin else "")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="one prompt set's folder of serve_sampling.sh (holding greedy/, top-p/, ...)")
    print(table(p.parse_args().folder))


if __name__ == "__main__":
    main()
