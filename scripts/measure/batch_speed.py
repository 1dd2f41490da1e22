"""In-process continuous batching on the real default pair (specdec.generate over a list of prompts): for 1, 2, 4
and 8 sequences at once, plain and speculative (the planned k per sequence, and the proposer's
k every round), the aggregate decode tokens/s, with every greedy output checked equal to its
prompt decoded alone. Rounds alternate the variants per concurrency (A/B/C, same prompts), the
first round is a discarded warm-up; medians over the rest.

    python scripts/measure/batch_speed.py --out docs/serving/batch-inprocess-amx [--rounds 3]

Writes results.json (per concurrency and variant: the tok/s of each round, the median, the
mean accepted length) and prints a table. The CPU model and flags are recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specdec import generate
from specdec.decode.plan import measured_plan
from specdec.load import LoadSpec, load
from specdec.methods.spec import parse
from specdec.prompts.chat import encode_prompt

PROMPTS = Path(__file__).resolve().parents[2] / "src/specdec/data/spec_bench_question.jsonl"


def prompts(tokenizer, n: int) -> list[list[int]]:
    """The first n Spec-Bench questions as chat prompts (the model's template)."""
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:n]]
    return [encode_prompt(tokenizer, r["turns"][0]) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--proposer", default="auto")
    a = ap.parse_args()
    loaded = load(LoadSpec(method=parse(a.proposer)))  # the default pair, as `specdec generate` loads it
    target, tokenizer, runs, drafter = loaded.target, loaded.tokenizer, loaded.method, loaded.proposer
    plan = measured_plan(target, drafter)
    clients = [int(c) for c in a.clients.split(",")]
    every = prompts(tokenizer, max(clients))
    alone = {i: generate(target, p, max_new_tokens=a.tokens, eos_token_id=[]).new_tokens
             for i, p in enumerate(every)}
    variants = {"plain": {"drafter": None}, "planned": {"drafter": drafter, "plan": plan},
                "fixed-k": {"drafter": drafter}}
    results: dict = {"method": runs.label, "tokens": a.tokens, "cpu": cpu(), "threads": os.cpu_count(),
                     "costs_ms": {"verify": {n: 1e3 * plan.verify(n) for n in (1, 2, 4, 8, 16, 32)},
                                  "draft": {n: 1e3 * plan.draft(n) for n in (1, 2, 4, 8)} if plan.draft else None},
                     "runs": {}}
    for n in clients:
        batch = every[:n]
        seen = {v: [] for v in variants}
        accepted = {v: [] for v in variants}
        for r in range(a.rounds + 1):
            for name, kw in variants.items():
                start = time.perf_counter()
                out = generate(target, batch, max_new_tokens=a.tokens, eos_token_id=[], **kw)
                wall = time.perf_counter() - start
                if [o.new_tokens for o in out] != [alone[i] for i in range(n)]:
                    sys.exit(f"{name} at {n}: an output differs from its prompt alone")
                decode = wall - sum(o.stats.times["prefill"] for o in out)  # the prefills run one by one
                if r:  # round 0 warms up
                    seen[name].append(sum(len(o.new_tokens) - 1 for o in out) / decode)
                    accepted[name].append(statistics.mean(o.stats.mean_accepted_length for o in out))
                print(f"clients {n} round {r} {name}: {wall:.1f} s", file=sys.stderr, flush=True)
        results["runs"][n] = {v: {"tokens_per_s": seen[v], "median": statistics.median(seen[v]),
                                  "mean_accepted_length": statistics.mean(accepted[v])} for v in variants}
        print(n, {v: round(results["runs"][n][v]["median"], 1) for v in variants}, flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")


def cpu() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    return "; ".join(line.split(":", 1)[1].strip() for line in info.splitlines()
                     if line.startswith(("Model name", "Flags")))[:2000]


if __name__ == "__main__":
    main()
