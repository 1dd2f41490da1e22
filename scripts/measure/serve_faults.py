"""Issue 51's faults sent to a running `specdec serve` as a user would: raw bodies with httpx (what
curl sends), the rest with the official openai client. One row per request, printed as a markdown
table: the fault, the status (or what the stream did), the body's first line, what the issue
expects and whether the answer held. Exit status 1 if any row did not hold.

    specdec serve --port 8091 --kv-tokens 4096 --max-sequences 2 &
    python scripts/measure/serve_faults.py --url http://127.0.0.1:8091 --kv-tokens 4096 --pid $!

--kv-tokens must be the server's (a request past it must be a 400); --max-sequences 2 lets two
long streams fill the server so that a third waits (the client that leaves while queued). With
--pid the last row sends SIGTERM during a request: the stream must end cleanly, new requests get
503 (or find the port closed) and the process must exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable

import httpx
import openai

SHORT = "Write a haiku about the sea."
JSON = {"Content-Type": "application/json"}


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str, bool]] = []

    def add(self, fault: str, status: str, body: str, expected: str, held: bool) -> None:
        first = body.strip().splitlines()[0] if body.strip() else ""
        self.rows.append((fault, status, first[:160].replace("|", "\\|"), expected, held))
        print(f"{'ok  ' if held else 'FAIL'} {fault}: {status} {first[:160]}", flush=True)

    def markdown(self) -> str:
        lines = ["| fault | answer | body (first line) | the issue expects | held |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {f} | {s} | {b} | {e} | {'yes' if h else '**no**'} |" for f, s, b, e, h in self.rows]
        return "\n".join(lines)


def gauge(url: str, name: str) -> float:
    """One unlabelled-by-reason sample of /metrics (summed over its lines)."""
    text = httpx.get(f"{url}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(rf"^specdec:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def cancelled(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(r'^specdec:requests_total{[^}]*outcome="cancelled"[^}]*} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for(check: Callable[[], bool], seconds: float) -> float | None:
    """Seconds until `check()` holds (None: not within `seconds`)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def raw(table: Table, url: str, fault: str, content: bytes, expect: int, headers: dict | None = None) -> None:
    reply = httpx.post(f"{url}/v1/completions", content=content, headers=headers or JSON, timeout=120)
    ok = reply.status_code == expect and "Traceback" not in reply.text
    table.add(fault, str(reply.status_code), reply.text, str(expect), ok)


def bodies(table: Table, url: str, model: str, kv_tokens: int) -> None:
    """The inputs a client may send that must be 4xx, never a 500 or a stall."""
    body = lambda **kw: json.dumps({"model": model, "prompt": SHORT, "max_tokens": 4, **kw}).encode()
    raw(table, url, "seed 2**63 (past int64)", body(seed=2**63), 400)
    raw(table, url, "temperature: an integer of 400 digits + .5", body()[:-1] + b', "temperature": 1' + b"0" * 400
        + b".5}", 400)
    raw(table, url, "temperature: 0.(300 zeros)1", body()[:-1] + b', "temperature": 0.' + b"0" * 300 + b"1}", 200)
    deep = b'{"model": "' + model.encode() + b'", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    raw(table, url, "JSON nested 100,000 deep", deep, 400)
    raw(table, url, "a lone surrogate \\ud800 in the prompt",
        b'{"model": "' + model.encode() + b'", "prompt": "a \\ud800 b", "max_tokens": 4}', 400)
    raw(table, url, "Content-Type: text/plain", body(), 415, {"Content-Type": "text/plain"})
    raw(table, url, "Origin: https://evil.example", body(), 403, {**JSON, "Origin": "https://evil.example"})
    raw(table, url, "Host: evil.example (DNS rebinding)", body(), 403, {**JSON, "Host": "evil.example"})
    raw(table, url, f"max_tokens {kv_tokens + 10} (past --kv-tokens {kv_tokens})", body(max_tokens=kv_tokens + 10), 400)


def long_beside_short(table: Table, url: str, client: openai.OpenAI, model: str, kv_tokens: int) -> None:
    """A stream asking for nearly the whole K/V budget, then three short requests one after the
    other: each short one's first token comes while the long one still runs."""
    stream = client.completions.create(model=model, prompt="Count from 1 to 10000, one number a line.",
                                       max_tokens=kv_tokens - 100, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks)
    for n in range(3):
        start = time.monotonic()
        short = client.completions.create(model=model, prompt=SHORT, max_tokens=8, temperature=0, stream=True)
        first = next(iter(short))
        ttft = time.monotonic() - start
        rest = "".join(c.choices[0].text for c in short if c.choices)
        table.add(f"short request {n + 1} beside a {kv_tokens - 100}-token one", f"200, first token {ttft:.2f} s",
                  (first.choices[0].text + rest) if first.choices else rest, "first token within a few rounds (< 5 s)",
                  ttft < 5)
    stream.close()
    gone = wait_for(lambda: gauge(url, "num_requests_running") == 0, 10)
    table.add("the long stream closed by its client", f"running 0 after {gone} s", "", "freed within a round",
              gone is not None)


def drain(stream) -> None:
    """Read a stream to its end, or until this script closes it."""
    try:
        for _ in stream:
            pass
    except (openai.APIConnectionError, httpx.HTTPError):
        pass


def leaves_while_queued(table: Table, url: str, client: openai.OpenAI, model: str) -> None:
    """Two long streams fill --max-sequences 2; a third waits; its client leaves."""
    streams = [client.completions.create(model=model, prompt=SHORT, max_tokens=400, temperature=0, stream=True)
               for _ in range(2)]
    readers = [threading.Thread(target=drain, args=(s,), daemon=True) for s in streams]
    for r in readers:
        r.start()
    before = cancelled(url)
    third = httpx.Client(timeout=60)
    with third.stream("POST", f"{url}/v1/completions", json={"model": model, "prompt": SHORT, "max_tokens": 50,
                                                              "stream": True}) as reply:
        queued = wait_for(lambda: gauge(url, "num_requests_waiting") == 1, 10)
        status = reply.status_code
    third.close()
    left = wait_for(lambda: gauge(url, "num_requests_waiting") == 0 and cancelled(url) == before + 1, 10)
    table.add("client leaves while queued (2 long streams running)", f"{status}; waited: {queued is not None}",
              f"queue empty and counted cancelled after {left} s", "queue place freed, cancelled",
              queued is not None and left is not None)
    for s in streams:
        s.close()
    wait_for(lambda: gauge(url, "num_requests_running") == 0, 10)


def leaves_while_prefilling(table: Table, url: str, model: str) -> None:
    """A ~3000-token prompt, not streamed; the openai client gives up after 1 s and closes."""
    prompt = " ".join(f"item{i}" for i in range(700))
    impatient = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=1.0)
    before = cancelled(url)
    start = time.monotonic()
    try:
        impatient.completions.create(model=model, prompt=prompt, max_tokens=20)
        outcome = "answered within 1 s"
    except openai.APITimeoutError:
        outcome = "client timed out after 1 s"
    freed = wait_for(lambda: gauge(url, "num_requests_running") == 0 and cancelled(url) == before + 1, 60)
    table.add("client leaves while its 3000-token prompt prefills (openai, timeout 1 s)", outcome,
              f"running 0 and cancelled {None if freed is None else round(time.monotonic() - start, 2)} s after "
              "sending", "slot freed within one round", freed is not None and freed < 10)


def leaves_while_decoding(table: Table, url: str, client: openai.OpenAI, model: str) -> None:
    before = cancelled(url)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": SHORT}],
                                            max_tokens=400, stream=True)
    chunks = iter(stream)
    next(chunks), next(chunks)
    stream.close()
    freed = wait_for(lambda: gauge(url, "num_requests_running") == 0 and cancelled(url) == before + 1, 10)
    table.add("client closes a chat stream after two chunks", "200 stream, closed",
              f"running 0 and cancelled {freed} s later", "generation stops", freed is not None)


def still_serves(table: Table, url: str, client: openai.OpenAI, model: str, when: str) -> None:
    reply = client.completions.create(model=model, prompt=SHORT, max_tokens=8, temperature=0)
    health = httpx.get(f"{url}/health")
    table.add(f"a short request and /health {when}", f"200, /health {health.status_code}", reply.choices[0].text,
              "answered; /health 200", health.status_code == 200 and reply.usage.completion_tokens > 0)


def sigterm(table: Table, url: str, client: openai.OpenAI, model: str, pid: int) -> None:
    """SIGTERM while a 60-token stream runs: it finishes (within --shutdown-timeout), a new request
    is refused, the process exits."""
    stream = client.completions.create(model=model, prompt=SHORT, max_tokens=60, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    try:
        late = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": SHORT, "max_tokens": 4}, timeout=10)
        refused = f"{late.status_code}: {late.text}"
    except httpx.TransportError as e:
        refused = f"connection refused ({type(e).__name__})"
    table.add("a new request after SIGTERM", refused.split(":")[0], refused, "503 or port closed",
              refused.startswith(("503", "connection")))
    last = [c for c in chunks if c.choices][-1]
    gone = wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
                    60)
    table.add("SIGTERM during a 60-token stream", f"stream ended: finish_reason {last.choices[0].finish_reason}",
              f"process gone {gone} s after the stream", "the stream finishes or aborts cleanly; the process exits",
              last.choices[0].finish_reason in ("length", "abort") and gone is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8091")
    parser.add_argument("--kv-tokens", type=int, required=True)
    parser.add_argument("--pid", type=int, default=None, help="the server's process: SIGTERM it at the end")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    table = Table()
    bodies(table, args.url, model, args.kv_tokens)
    still_serves(table, args.url, client, model, "after the bad bodies")
    long_beside_short(table, args.url, client, model, args.kv_tokens)
    leaves_while_queued(table, args.url, client, model)
    leaves_while_prefilling(table, args.url, model)
    leaves_while_decoding(table, args.url, client, model)
    still_serves(table, args.url, client, model, "after the clients left")
    if args.pid is not None:
        sigterm(table, args.url, client, model, args.pid)
    print(table.markdown())
    return 0 if all(row[-1] for row in table.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
