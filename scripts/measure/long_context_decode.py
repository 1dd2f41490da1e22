"""Decode speed after a long prompt, for the checkout whose root is the first argument: generate()
on the HumanEval text cut to --tokens tokens, 128 greedy tokens, plain and with the int3 draft
(32768-id head, k=4): the total time, the time to the first token and decode tokens/s (the
tokens after the first over the time after it, which with the draft holds its read of the
prompt: the first token goes out before it). Run it alternately for two checkouts (a `git
worktree` of the older one) to pair them; prints one JSON line (medians of 2 runs after a
warm-up), with the tokens so outputs can be compared. Run under the CPU lock:

    flock /tmp/cpu.lock env PYTHONPATH=ROOT/src .venv/bin/python scripts/measure/long_context_decode.py ROOT --tokens 4000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from specdec import DraftModel, generate
from specdec.models.load import load_tokenizer
from specdec.runtime import load_gguf

from runtime_bench import TARGET, int3_draft, long_prompt


def timed(target, prompt, drafter, new: int) -> dict:
    began, first = time.perf_counter(), []
    result = generate(target, prompt, drafter=drafter, max_new_tokens=new, eos_token_id=[],
                      on_commit=lambda tokens, from_draft: first.append(time.perf_counter() - began) and False)
    total = time.perf_counter() - began
    return {"decode_tok_s": (len(result.new_tokens) - 1) / (total - first[0]), "first_token_s": first[0],
            "total_s": total, "tokens": result.new_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="the checkout measured (reported only; PYTHONPATH picks the code)")
    parser.add_argument("--tokens", type=int, default=4000, help="prompt tokens")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--plain-only", action="store_true", help="skip the draft's runs")
    args = parser.parse_args()
    tokenizer = load_tokenizer(TARGET)
    target = load_gguf(TARGET, "int4")
    draft = int3_draft(tokenizer)
    prompt = long_prompt(tokenizer, args.tokens)
    report = {"root": args.root, "prompt_tokens": args.tokens}
    methods = {"plain": lambda: None, "draft": lambda: DraftModel(draft, k=4)}
    for name, make in list(methods.items())[: 1 if args.plain_only else 2]:
        runs = [timed(target, prompt, make(), args.new) for _ in range(3)][1:]
        report[name] = {"decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in runs), 2),
                        "first_token_s": round(statistics.median(r["first_token_s"] for r in runs), 3),
                        "total_s": round(statistics.median(r["total_s"] for r in runs), 3),
                        "tokens": runs[0]["tokens"]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
