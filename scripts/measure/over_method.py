"""Every method of a bench folder paired against one of its methods instead of `ar` (e.g.
llama.cpp's plain decoding, docs/quant.md): per prompt, tokens/s over that method's on the same
prompt and repeat; median and geometric mean over prompts with the bench's bootstrap intervals.

    .venv/bin/python scripts/measure/over_method.py docs/quant/kernels/humaneval llamacpp
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.bench.summary import paired_speedups, speedup_summary


def main() -> None:
    folder, baseline = Path(sys.argv[1]), sys.argv[2]
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    if baseline not in by_method:
        sys.exit(f"{folder} has no rows of {baseline!r}; its methods: {', '.join(by_method)}")
    print(f"| method | over `{baseline}`: median [95% CI] | geomean [95% CI] | prompts |")
    print("|---|---|---|---|")
    for method, own in by_method.items():
        if method == baseline:
            continue
        s = speedup_summary(paired_speedups(own, by_method[baseline]))
        print(f"| `{method}` | {s['median']:.2f}x [{s['ci95_median'][0]:.2f}, {s['ci95_median'][1]:.2f}] | "
              f"{s['geomean']:.2f}x [{s['ci95_geomean'][0]:.2f}, {s['ci95_geomean'][1]:.2f}] | {len(s['per_prompt'])} |")


if __name__ == "__main__":
    main()
