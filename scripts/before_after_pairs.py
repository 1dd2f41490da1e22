"""Pair scripts/forward_before_after.sh's two bench folders by prompt (docs/forward.md): per method,
the median over prompts of after/before decode tokens/s, and the same ratio for transformers'
generate (hf-ar), which neither checkout changes, as the measure of how the machine drifted
between the two runs; the drift-corrected ratio divides the first by the second per prompt.

    .venv/bin/python scripts/before_after_pairs.py docs/bench/forward-before-float32-humaneval-10 \
        docs/bench/forward-after-float32-humaneval-10
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# The before commit names the int8 draft draft-int8:k=2; today it is draft:k=2:quant=int8.
SAME = {"draft-int8:k=2": "draft:k=2:quant=int8"}


def speeds(folder: Path) -> dict[tuple[str, str], float]:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return {(SAME.get(r["method"], r["method"]), r["prompt_id"]): r["tokens_per_s"] for r in rows if r["repeat"] == 0}


def main() -> None:
    before, after = (speeds(Path(p)) for p in sys.argv[1:3])
    prompts = sorted({p for _, p in after} & {p for _, p in before})
    drift = {p: after[("hf-ar", p)] / before[("hf-ar", p)] for p in prompts}
    print(f"{len(prompts)} prompts paired")
    print("| method | before tok/s | after tok/s | after/before | drift-corrected (over hf-ar's after/before) |")
    print("|---|---|---|---|---|")
    for method in dict.fromkeys(m for m, _ in after):
        pairs = [p for p in prompts if (method, p) in before and (method, p) in after]
        ratio = [after[(method, p)] / before[(method, p)] for p in pairs]
        print(f"| `{method}` | {statistics.median(before[(method, p)] for p in pairs):.2f} | "
              f"{statistics.median(after[(method, p)] for p in pairs):.2f} | {statistics.median(ratio):.2f}x | "
              f"{statistics.median(r / drift[p] for r, p in zip(ratio, pairs)):.2f}x |")


if __name__ == "__main__":
    main()
