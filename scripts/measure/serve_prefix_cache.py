"""Time to first token of each turn of a conversation through `specdec serve`, with the prefix
cache (the default) and with --no-prefix-cache (issue 53). Two servers of the same models run
side by side; each repetition sends one 3-turn conversation to each, alternating which goes
first, the first repetition discarded as warm-up; medians per turn. Turn 1 pastes a real source
file of this checkout (decode/verify_tree.py, ~1,500 tokens) and asks about it; turns 2 and 3
resend the history with the server's own answers. Every repetition's first message starts with
its own line, so a repetition reuses nothing of an earlier one but the template's head. The
answers of the two servers must be equal (greedy). Prints one JSON line per repetition and the
medians.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/serve_prefix_cache.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

SOURCE = Path(__file__).resolve().parents[2] / "src/specdec/decode/verify_tree.py"
TURNS = [
    "Explain what this module does, briefly:\n\n```python\n{source}```",
    "Add type hints where they are missing and show the changed function.",
    "Now write one pytest test for verify_tree.",
]


def serve(port: int, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "specdec.cli", "serve", "--port", str(port), "--log-level", "warning",
               "--served-model-name", "default", *extra]
    server = subprocess.Popen(command, stderr=open(f"/tmp/serve_prefix_cache.{port}.log", "w"))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.kill()
    raise SystemExit(f"the server on port {port} did not start")


def conversation(port: int, rep: int, tokens: int) -> list[dict]:
    """The turns' time to first token (client side), prompt and cached tokens, and texts."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    messages, out = [], []
    for i, turn in enumerate(TURNS):
        text = turn.format(source=SOURCE.read_text())
        messages.append({"role": "user", "content": f"Session {rep}.\n{text}" if i == 0 else text})
        start, first, parts, last = time.perf_counter(), None, [], None
        for chunk in client.chat.completions.create(model="default", messages=messages, max_tokens=tokens,
                                                    stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter() - start
            parts += [c.delta.content or "" for c in chunk.choices]
            last = chunk
        usage = last.usage.model_dump()
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        text = "".join(parts)
        messages.append({"role": "assistant", "content": text})
        out.append({"ttft_s": round(first, 3), "prompt": usage["prompt_tokens"], "cached": cached,
                    "total_s": round(time.perf_counter() - start, 2), "text": text})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ports", type=int, nargs=2, default=[8191, 8192])
    args = ap.parse_args()
    sides = {"cache": serve(args.ports[0]), "no cache": serve(args.ports[1], "--no-prefix-cache")}
    ports = dict(zip(sides, args.ports))
    rows = {side: [] for side in sides}
    try:
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
            got = {side: conversation(ports[side], rep, args.tokens) for side in order}
            print(f"rep {rep} done", file=sys.stderr, flush=True)
            same = [a["text"] == b["text"] for a, b in zip(got["cache"], got["no cache"])]
            print(json.dumps({"rep": rep, "order": order, "same_text": same,
                              **{side: [{k: v for k, v in t.items() if k != "text"} for t in turns]
                                 for side, turns in got.items()}}), flush=True)
            if rep:
                for side, turns in got.items():
                    rows[side].append(turns)
    finally:
        for server in sides.values():
            server.terminate()
            server.wait(60)
    for side, reps in rows.items():
        medians = [statistics.median(r[i]["ttft_s"] for r in reps) for i in range(len(TURNS))]
        print(f"{side}: median time to first token per turn (s): {medians}")
    cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    print(f"cpu: {cpu.split(':', 1)[1].strip()}")


if __name__ == "__main__":
    main()
