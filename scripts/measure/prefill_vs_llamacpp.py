"""Prefill speed of specdec's native runtime against llama.cpp's llama-bench on the same GGUF and
prompt length, paired: the two alternate (the order swapped every round), each run under the CPU
lock, so a change in the machine's speed during the comparison (a shared host's) falls on both
sides; then the medians of each side and the median of the rounds' ratios. Issue 52's goal:
specdec >= 2x llama.cpp's tokens/s on a 2,000-token prompt (AVX-512 CPUs; 4x on AMX CPUs).

    .venv/bin/python scripts/measure/prefill_vs_llamacpp.py --rounds 3 --out DIR
    (each run takes /tmp/cpu.lock itself; llama-bench is scripts/setup_llama_server.sh's build for
    this CPU, --llama-bench PATH another)

Each run's JSON lands in DIR (llama-bench's own output; runtime_bench.py's report) and DIR/summary.json
holds the compact rows the docs cite."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from specdec.external.llama_server import binary
from specdec.gguf.where import gguf_path

HERE = Path(__file__).resolve().parent
MODELS = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}


def locked(command: list[str]) -> str:
    """stdout of `command` run under the CPU lock (benchmarks must not share the two cores)."""
    done = subprocess.run(["flock", "/tmp/cpu.lock", *command], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{command[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def llama_bench(tool: Path, tokens: int, out: Path) -> dict[str, float]:
    """llama.cpp's prefill tokens/s of each model (pp<tokens>, 2 threads, 1 repetition after its warm-up)."""
    paths = ",".join(str(gguf_path(name)) for name in MODELS.values())
    rows = json.loads(locked([str(tool), "-m", paths, "-p", str(tokens), "-n", "0", "-t", "2", "-r", "1", "-o", "json"]))
    out.write_text(json.dumps(rows, indent=1))
    by_path = {Path(r["model_filename"]).name: r["avg_ts"] for r in rows}
    return {role: by_path[gguf_path(name).name] for role, name in MODELS.items()}


def specdec_prefill(tokens: int, out: Path) -> dict[str, float]:
    """specdec's prefill tokens/s of the int4 target and the int3 draft (runtime_bench.py, 1 timed run each)."""
    locked([sys.executable, str(HERE / "runtime_bench.py"), "--parts", "prefill", "--repeats", "1",
            "--prefill-tokens", str(tokens), "--out", str(out)])
    report = json.loads(out.read_text())
    return {"target": report["prefill_target"]["tokens_per_s"], "draft": report["prefill_draft_int3_32768"]["tokens_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--llama-bench", type=Path, help="llama-bench to compare with (default: the build for this CPU)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tool = args.llama_bench or binary("llama-bench")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_ in range(1, args.rounds + 1):
        sides = {"llamacpp": lambda: llama_bench(tool, args.tokens, args.out / f"llamacpp-{round_}.json"),
                 "specdec": lambda: specdec_prefill(args.tokens, args.out / f"specdec-{round_}.json")}
        order = list(sides) if round_ % 2 else list(sides)[::-1]
        runs.append({side: sides[side]() for side in order})
        print(f"round {round_} of {args.rounds}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    summary = {"tokens": args.tokens, "llama_bench": str(tool), "rounds": runs}
    for role in MODELS:
        summary[role] = {
            "llamacpp_tok_s": round(statistics.median(r["llamacpp"][role] for r in runs), 1),
            "specdec_tok_s": round(statistics.median(r["specdec"][role] for r in runs), 1),
            "paired_ratio_median": round(statistics.median(r["specdec"][role] / r["llamacpp"][role] for r in runs), 3)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({role: summary[role] for role in MODELS}, indent=1))


if __name__ == "__main__":
    main()
