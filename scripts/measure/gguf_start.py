"""GGUF files as target and draft (issue 32's goals): start-up and memory from a cold and a warm
model cache, `specdec --help`, and decode speed of the pair given by path against the same pair
given by registry name (A/B alternating, the first round discarded as warm-up).

    python scripts/measure/gguf_start.py --out docs/gguf/RUN [--rounds 3] [--tokens 128]

The GGUF files are copied from the registry's assembled ones to a scratch folder (so the path and
the name are different files to the cache); the cold runs use a fresh SPECDEC_CACHE there, removed
at the end. Writes OUT/start.json (every run: command, wall seconds, peak resident KB, tokens/s)
and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Write a Python function that merges two sorted lists into one sorted list."
SPECDEC = str(Path(sys.executable).with_name("specdec"))


def run(argv: list[str], cache: Path) -> dict:
    """One command under /usr/bin/time: wall seconds, peak resident KB, its JSON output if any."""
    env = {**os.environ, "SPECDEC_CACHE": str(cache)}
    began = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "PEAK_KB %M", *argv], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    peak = int(re.search(r"PEAK_KB (\d+)", done.stderr).group(1))
    out = json.loads(done.stdout) if done.stdout.lstrip().startswith("{") else None
    return {"argv": argv, "wall_s": round(wall, 3), "peak_kb": peak, "json": out}


def generate(target: str, draft: str, proposer: str, tokens: int) -> list[str]:
    return [SPECDEC, "generate", "--target", target, "--draft", draft, "--proposer", proposer, "--prompt", PROMPT,
            "--max-new-tokens", str(tokens), "--json"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--proposer", default="draft:k=3:quant=int4")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parents[2] / "src"))
    from specdec.machine import environment
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET, gguf_file

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gguf-start-"))
    models = scratch / "models"
    models.mkdir()
    files = {}
    for role, name in (("target", DEFAULT_TARGET), ("draft", DEFAULT_DRAFT)):
        files[role] = models / f"{name}.gguf"
        if not files[role].exists():
            shutil.copy(gguf_file(name), files[role])
    cold = scratch / "cache"
    user_cache = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec")
    if (user_cache / "kernels").exists():  # the kernels' build is the set-up's, not the model's
        shutil.copytree(user_cache / "kernels", cold / "kernels")
    record: dict = {"machine": environment("cpu", "float32"), "proposer": args.proposer, "tokens": args.tokens}
    by_path = (str(files["target"]), str(files["draft"]))
    by_name = (DEFAULT_TARGET, DEFAULT_DRAFT)

    record["help"] = [run([SPECDEC, "--help"], cold)["wall_s"] for _ in range(3)]
    print(f"specdec --help: {record['help']} s", flush=True)
    record["cold"] = run(generate(*by_path, args.proposer, 16), cold)
    dense = [str(f) for f in cold.rglob("config.json")]
    record["cold"]["dense_folders"] = dense
    print(f"cold (empty cache, files by path): {record['cold']['wall_s']:.1f} s, peak "
          f"{record['cold']['peak_kb'] / 2**20:.2f} GiB, dense folders: {dense}", flush=True)
    first = [run(generate(*by_path, args.proposer, 1), cold) for _ in range(3)]
    record["warm_first_token"] = first
    print(f"warm, launch to the first token: {[r['wall_s'] for r in first]} s, peak "
          f"{max(r['peak_kb'] for r in first) / 2**20:.2f} GiB", flush=True)

    record["speed"] = {"path": [], "name": []}
    for round_ in range(args.rounds + 1):  # round 0: warm-up, discarded
        for label, pair in (("path", by_path), ("name", by_name)):
            result = run(generate(*pair, args.proposer, args.tokens), user_cache if label == "name" else cold)
            if round_:
                record["speed"][label].append(result)
    tps = {k: [r["json"]["stats"]["tokens_per_s"] for r in v] for k, v in record["speed"].items()}
    same = len({tuple(r["json"]["new_tokens"]) for v in record["speed"].values() for r in v}) == 1
    ratios = [a / b for a, b in zip(tps["path"], tps["name"])]
    record["summary"] = {"tokens_per_s": tps, "median_path_over_name": statistics.median(ratios),
                         "all_outputs_equal": same}
    print(f"decode tok/s by path {tps['path']}, by name {tps['name']}; median paired ratio "
          f"{statistics.median(ratios):.3f}; outputs equal: {same}", flush=True)
    shutil.rmtree(scratch)
    (out / "start.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
