"""Time to the first token of generate() with the default int3 draft (32768-id head, k=4) on a
2,000-token prompt (the HumanEval text), for the checkout whose root is the first argument: run it
alternately for two checkouts (a `git worktree` of the older one) to pair them. Prints one JSON
line (medians of 2 runs after a warm-up). Run under the CPU lock:

    flock /tmp/cpu.lock env PYTHONPATH=ROOT/src .venv/bin/python scripts/measure/first_token_draft.py ROOT
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from specdec import DraftModel, generate
from specdec.models.load import load_tokenizer
from specdec.runtime import load_gguf

from runtime_bench import TARGET, int3_draft, long_prompt


def main() -> None:
    tokenizer = load_tokenizer(TARGET)
    target = load_gguf(TARGET, "int4")
    draft = int3_draft(tokenizer)
    prompt = long_prompt(tokenizer, 2000)
    runs = []
    for at in range(3):
        began, first = time.perf_counter(), []
        result = generate(target, prompt, drafter=DraftModel(draft, k=4), max_new_tokens=16,
                          on_commit=lambda tokens, from_draft: first.append(time.perf_counter() - began) and False)
        if at:
            runs.append({"first_token_s": first[0], "total_s": time.perf_counter() - began,
                         "tokens": result.new_tokens})
    print(json.dumps({"root": sys.argv[1], "first_token_s": round(statistics.median(r["first_token_s"] for r in runs), 3),
                      "total_s": round(statistics.median(r["total_s"] for r in runs), 3), "tokens": runs[0]["tokens"]}))


if __name__ == "__main__":
    main()
