"""Sampling against greedy decoding, the same method, the same prompts (issue 33's goal: sampling
at temperature 0.8 with top_p 0.95, and llama.cpp's chain, within 10% of greedy's tokens/s).

Loads the pair once as `specdec generate` does (specdec.load: `--proposer auto` resolved, the
registry's default pair, int4 on the native runtime where it runs) and decodes every prompt with
every (method, sampling) cell, in an order that rotates from prompt to prompt, so that each
sampling run has its greedy run of the same prompt and method beside it in time. One warm-up
pass over all cells on a prompt outside the measured ones is discarded. Per run: decode tok/s as
`specdec generate` prints it (tokens after the first over the decode time), the phase times
(propose, verify, accept) and the tokens. Wrap in `flock /tmp/cpu.lock` on a shared machine.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/sampling_speed.py --limit 10 \\
        --max-new-tokens 128 --out docs/sampling/speed-amx

Writes OUT/runs.jsonl (one row per run), OUT/summary.json and OUT/report.md: per method and
sampling setting the median tok/s and the median of the per-prompt ratios to greedy.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specdec.cli.args import spec_of
from specdec.cli.flags import add_model_args

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "T0.8 top_p 0.95": {"temperature": 0.8, "top_p": 0.95},
    "T0.8 min_p 0.05": {"temperature": 0.8, "min_p": 0.05},
    # llama.cpp's default chain (llama-cli / llama-server): top-k 40, top-p 0.95, min-p 0.05, T 0.8
    "T0.8 top_k 40 top_p 0.95 min_p 0.05": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--limit", type=int, default=10, help="prompts measured (after the warm-up prompt)")
    ap.add_argument("--offset", type=int, default=0, help="first measured prompt; the warm-up uses the one "
                                                          "after the last measured")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,auto", help="comma list of --proposer specs (default ar,auto)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of: " + ", ".join(SETTINGS))
    ap.add_argument("--seed", type=int, default=0, help="sampling seed of prompt i is seed + i")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes over all prompts (each cell's figure: the fastest of its runs, the one other "
                         "jobs on the machine disturbed least; the median of runs is in summary.json too)")
    ap.add_argument("--out", type=Path, required=True)
    add_model_args(ap)  # --target, --draft and how they load, as `specdec generate` takes them
    opts = ap.parse_args()

    import torch

    from specdec.decode.engine import generate
    from specdec.load import choose, load
    from specdec.load.models import load_drafts
    from specdec.methods.build import build_proposer
    from specdec.methods.spec import parse
    from specdec.prompts.chat import encode_prompt
    from specdec.prompts.datasets import Selection, load_prompts

    settings = {name: SETTINGS[name] for name in opts.settings.split(",")}
    prompts, _ = load_prompts(opts.dataset, Selection(limit=opts.offset + opts.limit + 1))
    measured, warm = prompts[opts.offset: opts.offset + opts.limit], prompts[opts.offset + opts.limit]

    loaded = {}  # method spec -> (drafter, label); the pair loads once, by the first method that drafts
    target = tokenizer = lm = None
    specs = opts.methods.split(",")
    for spec in sorted(specs, key=lambda s: s in ("ar", "none")):  # drafting methods first
        what = spec_of(opts, parse(spec))
        if target is None:
            first = load(what)
            target, tokenizer, method, drafter, lm = (first.target, first.tokenizer, first.method, first.proposer,
                                                      first.lm())
        else:  # the same target: only the proposer is built beside it
            method = choose(what).method
            drafter = build_proposer(method, load_drafts(what, target, tokenizer, [method]), None)
        loaded[spec] = (drafter, method.label)
    loaded = {spec: loaded[spec] for spec in specs}
    cells = [(spec, name) for spec in loaded for name in settings]

    def run(prompt_ids, spec, name, seed):
        drafter, label = loaded[spec]
        s = settings[name]
        started = time.perf_counter()
        result = generate(lm, prompt_ids, drafter=drafter, max_new_tokens=opts.max_new_tokens,
                          temperature=s["temperature"], top_k=s.get("top_k"), top_p=s.get("top_p"),
                          min_p=s.get("min_p", 0.0), seed=seed)
        wall = time.perf_counter() - started
        st = result.stats
        return {"method": spec, "label": label, "setting": name, **s, "seed": seed, "tokens": st.new_tokens,
                "tok_s": st.tokens_per_s, "wall_s": wall, "phases_s": dict(st.times), "rounds": st.rounds,
                "proposed": st.proposed, "accepted": st.accepted, "finish": result.finish_reason,
                "new_tokens": result.new_tokens}

    opts.out.mkdir(parents=True, exist_ok=True)
    env = environment(torch)
    (opts.out / "config.json").write_text(json.dumps({"argv": sys.argv, "settings": settings, "cells": cells,
                                                      "prompts": [p.id for p in measured], "warm_up": warm.id,
                                                      "methods": {k: v[1] for k, v in loaded.items()},
                                                      "environment": env}, indent=2))
    warm_ids = encode_prompt(tokenizer, warm.text)
    for spec, name in cells:
        run(warm_ids, spec, name, opts.seed)
    rows = []
    with open(opts.out / "runs.jsonl", "w") as f:
        for repeat, (i, prompt) in ((r, p) for r in range(opts.repeats) for p in enumerate(measured)):
            ids = encode_prompt(tokenizer, prompt.text)
            shift = (i + 3 * repeat) % len(cells)  # rotate the order from prompt to prompt and pass to pass
            for spec, name in cells[shift:] + cells[:shift]:
                row = {"prompt": prompt.id, "repeat": repeat, "prompt_tokens": len(ids),
                       **run(ids, spec, name, opts.seed + i), "loadavg": load_average()}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{prompt.id:14s} {spec:6s} {name:36s} {row['tok_s']:6.2f} tok/s {row['tokens']:4d} tok "
                      + " ".join(f"{k} {v:.2f}" for k, v in row["phases_s"].items()), file=sys.stderr, flush=True)
    summary = summarize(rows, cells)
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (opts.out / "report.md").write_text(report(summary, env, sys.argv))
    print(report(summary, env, sys.argv))
    return 0


def load_average() -> float | None:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def summarize(rows: list[dict], cells: list[tuple[str, str]]) -> dict:
    """Per cell and prompt the fastest of its repeats (all repeats decode the same tokens: same
    seed), then medians over prompts and of the per-prompt ratios."""
    by: dict = {}
    for r in rows:
        key = (r["prompt"], r["method"], r["setting"])
        by.setdefault(key, []).append(r)
    spread = {f"{k[1]} | {k[2]} | {k[0]}": [round(r["tok_s"], 2) for r in v] for k, v in by.items() if len(v) > 1}
    by = {k: max(v, key=lambda r: r["tok_s"]) for k, v in by.items()}
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    out = {}
    for spec, name in cells:
        mine = [by[(p, spec, name)] for p in prompts]
        ratios = [by[(p, spec, name)]["tok_s"] / by[(p, spec, "greedy")]["tok_s"] for p in prompts
                  if (p, spec, "greedy") in by]
        vs_ar = [by[(p, spec, name)]["tok_s"] / by[(p, "ar", name)]["tok_s"] for p in prompts
                 if (p, "ar", name) in by and spec != "ar"]
        phases = {k: statistics.median(1e3 * r["phases_s"][k] / max(1, r["tokens"]) for r in mine)
                  for k in mine[0]["phases_s"]}
        out[f"{spec} | {name}"] = {
            "method": spec, "label": mine[0]["label"], "setting": name, "prompts": len(mine),
            "median_tok_s": statistics.median(r["tok_s"] for r in mine),
            "median_ratio_to_greedy": statistics.median(ratios) if ratios else None,
            "ratios_to_greedy": ratios,
            "median_speedup_over_ar": statistics.median(vs_ar) if vs_ar else None,
            "median_ms_per_token_by_phase": phases,
            "median_tokens": statistics.median(r["tokens"] for r in mine),
            "acceptance": (sum(r["accepted"] for r in mine) / sum(r["proposed"] for r in mine)
                           if sum(r["proposed"] for r in mine) else None),
        }
    out["repeats_tok_s"] = spread
    return out


def report(summary: dict, env: dict, argv: list[str]) -> str:
    lines = ["# Sampling against greedy decoding", "", f"`{' '.join(argv)}`", "",
             (f"CPU: {env['cpu']} ({env['cores']} cores), torch {env['torch']}, {env['threads']} threads, "
             f"{env['date']}"), "",
             ("Per cell and prompt the fastest of its runs (--repeats; the runs of a cell decode the same "
              "tokens); medians over the prompts. Speculative ratios to greedy include the sampled text's "
              "own acceptance; the ms/token columns show what the filters themselves cost."), "",
             ("| method | sampling | median tok/s | median ratio to greedy (per prompt) | min ratio | "
             "speedup over ar | ms/token propose / verify / accept | acceptance |"),
             "|---|---|---|---|---|---|---|---|"]
    for s in (v for k, v in summary.items() if k != "repeats_tok_s"):
        ph = s["median_ms_per_token_by_phase"]
        ratio = "" if s["median_ratio_to_greedy"] is None else f"{s['median_ratio_to_greedy']:.3f}"
        low = "" if not s["ratios_to_greedy"] else f"{min(s['ratios_to_greedy']):.3f}"
        over = "" if s["median_speedup_over_ar"] is None else f"{s['median_speedup_over_ar']:.2f}x"
        acc = "" if s["acceptance"] is None else f"{100 * s['acceptance']:.0f}%"
        lines.append(f"| {s['method']} ({s['label']}) | {s['setting']} | {s['median_tok_s']:.2f} | {ratio} | {low} | "
                     f"{over} | {ph.get('propose', 0):.1f} / {ph.get('verify', 0):.1f} / {ph.get('accept', 0):.1f} "
                     f"| {acc} |")
    return "\n".join(lines) + "\n"


def environment(torch) -> dict:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        lscpu = ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                               if line.startswith(name + ":")), "")
    flags = field("Flags").split()
    return {"cpu": field("Model name") or platform.processor(), "model": field("Model"),
            "cores": field("CPU(s)"), "flags": [f for f in flags if f.startswith(("avx", "amx", "fma"))],
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


if __name__ == "__main__":
    sys.exit(main())
