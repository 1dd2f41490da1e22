"""The suffix proposer on a repeated-code workload (issue 53): request 1 asks for a module,
request 2 (the conversation so far) for an edit that repeats it. Each method decodes request 2
with a fresh proposer; the memory methods first learn request 1's prompt and answer (finish), as
a server's proposer would have. Paired: every repetition runs all methods, in rotated order, the
first repetition discarded as warm-up; medians. Greedy, the default pair, int4 target.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/suffix_memory.py --reps 4 --new 256 [--fresh]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from specdec import generate
from specdec.gguf import tokenizer_of
from specdec.methods.build import Drafts, build_proposer
from specdec.methods.spec import parse
from specdec.prompts.chat import encode_messages
from specdec.runtime import load_gguf

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
DEFAULT_DRAFT = "k=4:quant=int3:vocab=32768:conf=0.6"  # this CPU kind's default draft (tune.saved)
METHODS = ["ar", f"draft:{DEFAULT_DRAFT}", "lookup:k=8", "suffix:k=8", f"suffix+draft:{DEFAULT_DRAFT}"]
ASK = ("Write a small Python module `inventory.py` with a dataclass `Item` (name, price, quantity) and "
       "a class `Inventory` with methods add_item, remove_item, total_value and most_expensive. Code only.")
EDIT = ("Rename the class `Inventory` to `Stock` and `total_value` to `value`, and give the whole module "
        "again. Code only.")
# --fresh: request 2 shares nothing with request 1 (what the memory costs where it cannot help)
FRESH = "Explain in a few sentences when a Python tuple is a better choice than a list."


def cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3, help="repetitions, the first discarded")
    parser.add_argument("--new", type=int, default=192, help="new tokens per request")
    parser.add_argument("--fresh", action="store_true", help="request 2 an unrelated question, not the edit")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = tokenizer_of(TARGET)
    target = load_gguf(TARGET, "int4")
    methods = [parse(m) for m in METHODS]
    drafts = Drafts(None, tokenizer, source=DRAFT, native={m.draft_variant for m in methods if m.uses_draft})
    drafts.prepare(methods)
    first = [{"role": "user", "content": ASK}]
    prompt1 = encode_messages(tokenizer, first)
    answer1 = generate(target, prompt1, max_new_tokens=args.new).new_tokens
    second = [*first, {"role": "assistant", "content": tokenizer.decode(answer1, skip_special_tokens=True)},
              {"role": "user", "content": EDIT}]
    prompt2 = encode_messages(tokenizer, [{"role": "user", "content": FRESH}] if args.fresh else second)
    plain2 = None
    rows: dict[str, list[dict]] = {m.label: [] for m in methods}
    for rep in range(args.reps):
        for method in methods[rep % len(methods):] + methods[: rep % len(methods)]:
            proposer = build_proposer(method, drafts)
            if method.kind.startswith("suffix"):
                proposer.finish(prompt1 + answer1)
            start = time.perf_counter()
            out = generate(target, prompt2, drafter=proposer, max_new_tokens=args.new)
            wall = time.perf_counter() - start
            plain2 = plain2 or (out.new_tokens if method.kind == "ar" else None)
            row = {"rep": rep, "wall_s": wall, "tokens": len(out.new_tokens), "tok_s": out.stats.tokens_per_s,
                   "mean_accepted": out.stats.mean_accepted_length, "rounds": out.stats.rounds,
                   "same_as_plain": None, "out": out.new_tokens}
            rows[method.label].append(row)
    for label, runs in rows.items():
        for row in runs:
            row["same_as_plain"] = row.pop("out") == plain2
    kept = {label: [r for r in runs if r["rep"] > 0] for label, runs in rows.items()}
    base = statistics.median(r["tok_s"] for r in kept["ar"])
    summary = {label: {"tok_s": statistics.median(r["tok_s"] for r in runs),
                       "over_plain": statistics.median(r["tok_s"] for r in runs) / base,
                       "mean_accepted": statistics.median(r["mean_accepted"] for r in runs),
                       "wall_s": statistics.median(r["wall_s"] for r in runs),
                       "all_same_as_plain": all(r["same_as_plain"] for r in rows[label])}
               for label, runs in kept.items()}
    print(json.dumps({"cpu": cpu_model(), "prompt2_tokens": len(prompt2), "new": args.new, "summary": summary,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
