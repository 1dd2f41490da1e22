"""The first constrained requests' latency on a fresh `specdec serve` of the default pair: the
server's start, then three `json_object` chat requests of 8 tokens (docs/agents.md: the grammar
library's vocabulary is built during warm-up, so the first request does not wait for it).

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/first_constrained.py
"""

import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from serve_native import launch, stop  # noqa: E402  (the tests' in-process server launcher)

began = time.perf_counter()
running = launch(["--max-sequences", "1"])
ready = time.perf_counter() - began
body = {"model": running.name, "messages": [{"role": "user", "content": "Give a JSON object with a key a."}],
        "max_tokens": 8, "temperature": 0, "response_format": {"type": "json_object"}}
waits = []
for _ in range(3):
    sent = time.perf_counter()
    reply = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=120)
    waits.append(time.perf_counter() - sent)
    reply.raise_for_status()
stop(running)
print(f"ready {ready:.2f} s; constrained requests {' '.join(f'{w * 1000:.0f}' for w in waits)} ms")
