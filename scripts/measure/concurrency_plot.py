"""Tokens/s per request and in all, and time to first token (p50, p99), against the number of
clients, for any set of servers measured by `specdec bench --concurrency N` (issue 34's figure):
one series per server, each drawn from the bench folders of its levels.

    .venv/bin/python scripts/measure/concurrency_plot.py \\
        --series "llama-server plain=docs/serving/llama-server-concurrency-amx/humaneval@llama-plain" \\
        --series "llama-server spec=docs/serving/llama-server-concurrency-amx/humaneval@llama-spec" \\
        --series "specdec plain=runs/specdec-conc@specdec-plain" --out docs/serving/concurrency-humaneval.png

`--series LABEL=DIR[@ENDPOINT]`: DIR is a bench folder or a folder holding bench folders at any
depth (serving_bench.py --concurrency writes DIR/bench-cN); each folder's level is its config's
`concurrency`; ENDPOINT names the endpoint (bench's `endpoint:name=ENDPOINT` rows), and may be
left out where the folders measured one endpoint. Two folders of one series at the same level
are an error. The figures use bench's own definitions (specdec.bench.summary): per request, the
median decode tokens/s with its quartiles; in all, each wave's new tokens over its wall time
(prefills included) and, where the rows have it, its decode tokens over the time any of its
requests was decoding; TTFT percentiles over the requests. `--table` prints the same as a
Markdown table, with each level's outputs compared with the same server's at its fewest clients
(issue 34: a request's greedy output under load should be its output alone): prompts equal,
and the first differing ones.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from specdec.bench.equality import same_output
from specdec.bench.store import CONFIG, read_rows
from specdec.bench.summary import percentiles, quartiles
from specdec.files import read_json

ENDPOINT = "endpoint:name="


@dataclass
class Level:
    clients: int
    folder: Path
    per_request: dict  # quartiles of decode tok/s
    in_all: dict | None  # quartiles over rows of wave tokens / wave s
    in_all_decode: dict | None  # ... of wave decode tokens / wave decode s
    ttft: dict  # percentiles
    rows: list[dict]


def bench_folders(root: Path) -> list[Path]:
    return sorted({p.parent for p in ([root / CONFIG] if (root / CONFIG).is_file() else root.rglob(CONFIG))})


def endpoint_of(folders: list[Path], name: str | None, series: str) -> str:
    """The method label of the series' endpoint (`name`, or the one endpoint its folders hold)."""
    found = {m for f in folders for m in read_json(f / CONFIG)["methods"] if m.startswith(ENDPOINT)}
    if name is not None:
        if ENDPOINT + name not in found:
            raise SystemExit(f"--series {series}: no endpoint {name} in its folders (they have: "
                             f"{', '.join(sorted(m[len(ENDPOINT):] for m in found)) or 'none'})")
        return ENDPOINT + name
    if len(found) != 1:
        raise SystemExit(f"--series {series}: name the endpoint after @ (its folders have: "
                         f"{', '.join(sorted(m[len(ENDPOINT):] for m in found)) or 'none'})")
    return found.pop()


def levels(spec: str) -> tuple[str, list[Level]]:
    label, sep, where = spec.partition("=")
    if not sep or not label or not where:
        raise SystemExit(f"--series takes LABEL=DIR[@ENDPOINT], got {spec!r}")
    path, _, name = where.partition("@")
    folders = bench_folders(Path(path))
    if not folders:
        raise SystemExit(f"--series {spec}: no bench folder (config.json) under {path}")
    method = endpoint_of(folders, name or None, spec)
    out: dict[int, Level] = {}
    for folder in folders:
        rows = [r for r in read_rows(folder) if r["method"] == method]
        if not rows:
            continue
        n = read_json(folder / CONFIG).get("concurrency", 1)
        if n in out:
            raise SystemExit(f"--series {spec}: two folders at {n} clients: {out[n].folder} and {folder}")
        out[n] = Level(n, folder, quartiles([r["tokens_per_s"] for r in rows if r["tokens_per_s"]]),
                       quartiles([r["wave_tokens"] / r["wave_s"] for r in rows if r.get("wave_s")]),
                       quartiles([r["wave_decode_tokens"] / r["wave_decode_s"] for r in rows if r.get("wave_decode_s")]),
                       percentiles([r["prefill_s"] for r in rows]), rows)
    if not out:
        raise SystemExit(f"--series {spec}: no rows of {method} under {path}")
    return label, [out[n] for n in sorted(out)]


def draw(series: dict[str, list[Level]], title: str | None) -> Figure:
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    per_request, in_all, ttft = fig.subplots(1, 3)
    ticks = sorted({lv.clients for lvs in series.values() for lv in lvs})
    for i, (label, lvs) in enumerate(series.items()):
        color = f"C{i}"
        x = [lv.clients for lv in lvs]
        med = [lv.per_request["median"] for lv in lvs]
        err = [[m - lv.per_request["q1"] for m, lv in zip(med, lvs)], [lv.per_request["q3"] - m for m, lv in zip(med, lvs)]]
        per_request.errorbar(x, med, yerr=err, marker="o", capsize=3, color=color, label=label)
        both = [(lv.clients, lv.in_all["median"]) for lv in lvs if lv.in_all]
        if both:
            in_all.plot(*zip(*both), marker="o", color=color, label=f"{label}: new tokens / wall time")
        dec = [(lv.clients, lv.in_all_decode["median"]) for lv in lvs if lv.in_all_decode]
        if dec:
            in_all.plot(*zip(*dec), marker="s", ls="--", color=color, label=f"{label}: decode only")
        ttft.plot(x, [lv.ttft["p50"] for lv in lvs], marker="o", color=color, label=f"{label} p50")
        ttft.plot(x, [lv.ttft["p99"] for lv in lvs], marker="v", ls="--", color=color, label=f"{label} p99")
    for ax, ylabel in ((per_request, "decode tokens/s per request (median, q1-q3)"),
                       (in_all, "tokens/s in all (median over waves)"),
                       (ttft, "time to first token, s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("clients at once (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(title)
    return fig


def equal_to_fewest(level: Level, fewest: Level) -> str:
    """`k/n` prompts whose output equals the same server's at its fewest clients (ids where both
    rows name them, else text), and the ones that differ."""
    alone = {(r["prompt_id"], r["repeat"]): r for r in fewest.rows}
    pairs = [(r["prompt_id"], same_output(r, alone[k])) for r in level.rows if (k := (r["prompt_id"], r["repeat"])) in alone]
    differ = list(dict.fromkeys(p for p, equal in pairs if not equal))
    return f"{len(pairs) - len(differ)}/{len(pairs)}" + (f" ({', '.join(differ)} differ)" if differ else "")


def markdown(series: dict[str, list[Level]]) -> str:
    f = lambda q: "-" if q is None else f"{q['median']:.2f}"
    lines = ["| server | clients | decode tok/s per request, median [q1, q3] | in all tok/s | in all decode tok/s "
             "| TTFT p50 s | TTFT p99 s | output equal to its fewest clients' |", "|---|---|---|---|---|---|---|---|"]
    for label, lvs in series.items():
        for lv in lvs:
            q = lv.per_request
            same = "(reference)" if lv is lvs[0] else equal_to_fewest(lv, lvs[0])
            lines.append(f"| {label} | {lv.clients} | {q['median']:.2f} [{q['q1']:.2f}, {q['q3']:.2f}] | {f(lv.in_all)} "
                         f"| {f(lv.in_all_decode)} | {lv.ttft['p50']:.2f} | {lv.ttft['p99']:.2f} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--series", action="append", required=True, metavar="LABEL=DIR[@ENDPOINT]")
    p.add_argument("--out", required=True, help="the PNG to write (e.g. docs/serving/concurrency.png)")
    p.add_argument("--title")
    p.add_argument("--table", action="store_true", help="also print the figures as a Markdown table")
    args = p.parse_args(argv)
    series = dict(levels(s) for s in args.series)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    draw(series, args.title).savefig(out, dpi=110)
    if args.table:
        print(markdown(series))
    print(f"[concurrency_plot] {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
