"""Blocks of 1, 5 and 8 rows of one sequence (a verify block's shape) forwarded by the real int4
target (or the int3 draft) after a prompt of --context tokens: the median wall and attention ms
of 15 forwards after a discarded one, each trimmed back to the prompt. One JSON line. Built from
the kernels in DIR (a folder with decoder.cpp and qgemm.cpp: `src/specdec/kernels`, or a copy
of another revision's), so two builds are paired by running this alternately, one process each:

    flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/measure/block_forward.py DIR --context 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from runtime_bench import TARGET, int3_draft, long_prompt, use_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernels", type=Path, help="a folder with decoder.cpp and qgemm.cpp")
    parser.add_argument("--model", choices=["target", "draft"], default="target")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens before the blocks")
    args = parser.parse_args()
    use_kernels(args.kernels)
    from specdec.decode.batch import forward_blocks
    from specdec.models.load import load_tokenizer
    from specdec.runtime import load_gguf
    from specdec.runtime.native.decoder import stage_seconds

    tokenizer = load_tokenizer(TARGET)
    lm = load_gguf(TARGET, "int4") if args.model == "target" else int3_draft(tokenizer)
    prompt = long_prompt(tokenizer, args.context + 8)
    lane = lm.lane(args.context + 16)
    lane.prefill(prompt[: args.context])
    report = {"kernels": str(args.kernels), "model": args.model, "context": args.context}
    for rows in (1, 5, 8):
        walls, attention = [], []
        for at in range(16):
            stage_seconds()
            began = time.perf_counter()
            forward_blocks([(lane, prompt[args.context : args.context + rows], False)])
            wall, stages = time.perf_counter() - began, stage_seconds()
            lane.trim(args.context)
            if at:
                walls.append(1e3 * wall)
                attention.append(1e3 * stages["attention"])
        report[f"{rows} rows"] = {"wall_ms": round(statistics.median(walls), 2),
                                  "attention_ms": round(statistics.median(attention), 2)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
