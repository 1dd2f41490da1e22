"""`n` choices in one request against the same n requests sent at once, through `specdec serve`
(issue 54). One server of the default pair; each repetition sends, in alternating order, (A) one
chat request with n choices and (B) n requests with n = 1 and the same messages, all at once from
n threads; the first repetition is discarded as warm-up. The prompt pastes a source file of this
checkout (decode/verify_tree.py, ~1,500 tokens) under a line of its own per repetition and arm,
so nothing of an earlier one is cached but the template's head. Greedy: the n answers of each
arm must be equal. Per arm: wall time until every answer is in, prompt tokens forwarded
(timings.prompt_n summed over the choices) and the prompt tokens taken from the cache (cache_n).
Prints one JSON line per repetition and the medians and the paired ratio B/A.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/serve_n.py --reps 4 --n 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from serve_prefix_cache import serve

SOURCE = Path(__file__).resolve().parents[2] / "src/specdec/decode/verify_tree.py"


def messages(tag: str) -> list[dict]:
    return [{"role": "user", "content": f"Session {tag}.\nExplain what this module does, briefly:\n\n```python\n"
                                        f"{SOURCE.read_text()}```"}]


def one_request(client: openai.OpenAI, tag: str, n: int, tokens: int) -> tuple[list[str], list[dict]]:
    reply = client.chat.completions.create(model="default", messages=messages(tag), max_tokens=tokens, n=n,
                                           temperature=0)
    return [c.message.content for c in reply.choices], [c.model_extra["timings"] for c in reply.choices]


def n_requests(client: openai.OpenAI, tag: str, n: int, tokens: int) -> tuple[list[str], list[dict]]:
    with ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda _: client.chat.completions.create(
            model="default", messages=messages(tag), max_tokens=tokens, temperature=0), range(n)))
    return [r.choices[0].message.content for r in replies], [r.model_extra["timings"] for r in replies]


def timed(arm, client, tag: str, n: int, tokens: int) -> dict:
    start = time.perf_counter()
    texts, timings = arm(client, tag, n, tokens)
    return {"wall_s": time.perf_counter() - start, "prompt_n": sum(t["prompt_n"] for t in timings),
            "cache_n": sum(t["cache_n"] for t in timings), "texts": texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=4, help="repetitions, the first discarded")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=8231)
    args = parser.parse_args()
    server = serve(args.port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none", max_retries=0, timeout=900)
    rows = []
    try:
        for rep in range(args.reps):
            arms = [("one_request", one_request), ("n_requests", n_requests)]
            row = {"rep": rep}
            for name, arm in arms if rep % 2 == 0 else arms[::-1]:
                row[name] = timed(arm, client, f"{rep}{name}", args.n, args.tokens)
            row["all_equal"] = all(len(set(row[name].pop("texts"))) == 1 for name, _ in arms)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        server.terminate()
        server.wait(60)
    kept = rows[1:]
    summary = {name: {key: statistics.median(r[name][key] for r in kept) for key in ("wall_s", "prompt_n", "cache_n")}
               for name in ("one_request", "n_requests")}
    summary["ratio_wall_n_requests_over_one"] = statistics.median(
        r["n_requests"]["wall_s"] / r["one_request"]["wall_s"] for r in kept)
    summary["all_equal"] = all(r["all_equal"] for r in rows)
    cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    print(json.dumps({"median": summary, "args": vars(args), "cpu": cpu.split(":", 1)[1].strip()}))


if __name__ == "__main__":
    main()
