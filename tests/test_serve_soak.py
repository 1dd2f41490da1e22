"""A bounded soak of `specdec serve` on its native runtime (issue 51): 300 requests of mixed
length, 6 clients at once against a server that decodes 4 together (so some wait), a third of
them cancelled by their clients at a random stage, through the official openai client and httpx.

Request i is drawn from random.Random(i): a short or a long prompt (about 10 or 400 tokens here),
chat or completions, streamed or not, max_tokens 1-64, every fourth answered one sampled
(temperature 0.8, seeded), `ignore_eos`. Every third request (i % 3 == 2) is left by its client:
while queued (the body sent, the connection closed within 50 ms), while prefilling (a long
prompt streamed, closed once the reply's headers come) or while decoding (a stream closed after
1-3 chunks). Every tenth (i % 10 == 9) is a bad input answered with its 4xx (malformed JSON,
max_tokens 0, an unknown model: 404, a token id outside the vocabulary, a body over
--max-body-bytes: 413).

Afterwards: every answered request returned its max_tokens tokens, each greedy one equal to the
target alone in process (token ids where a completion carries them, else text); /metrics accounts
for every request (stop + length + cancelled = the requests that decoded, error 0, rejected by
reason = the bad ones), and shows clients left both before their request started and after
its first tokens (those that left while it prefilled are counted and printed, not required: a
prompt prefilled alone is not cancellable before its end, tests/test_serve_prefill_alone.py);
nothing is left running or
waiting; /health 200 and a greedy request still equal to the target alone. No growth: resident
memory (psutil) at the end within 10% of after the first 10 requests and, here, under 32 MiB over
the second half; the same named threads (and no more of anyio's pool workers than requests at
once); no more open file descriptors with the clients closed. tests/test_serve_real.py runs the
same soak on the real pair.

About 15 s on 2 cores with start-up (the soak itself 5-7 s), so it runs with the default tests.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import openai
import psutil
import pytest
from gguf_files import VOCAB
from serve_native import start_native, stop, target_alone

AT_ONCE, SEQUENCES = 6, 4
MAX_TOKENS = 64
BODY_LIMIT = 1 << 16
# A budget the soak fills early: the prefix cache keeps ended requests' K/V up to it, so the memory
# measured after the first requests is its plateau, and growth past that is a leak.
SERVER_FLAGS = ("--max-sequences", str(SEQUENCES), "--max-queue", "16", "--kv-tokens", "2048")
BAD = [  # (body or raw bytes, status, reason counted in requests_rejected)
    (b"{not json", 400, "invalid"),
    ({"prompt": "a b", "max_tokens": 0}, 400, "invalid"),
    ({"prompt": "a b", "model": "gpt-4"}, 404, "invalid"),
    ({"prompt": [1, 2, VOCAB]}, 400, "invalid"),
    ({"prompt": "a " * BODY_LIMIT}, 413, "too_large"),
]


@dataclass
class Reference:
    """What the soak compares greedy replies with: the target alone's greedy tokens (past end
    tokens, MAX_TOKENS of them) for each prompt as completions and as chat encode it."""

    tokenizer: object
    ids: dict[tuple[str, bool], list[int]] = field(default_factory=dict)

    def text(self, prompt: str, chat: bool, tokens: int) -> str:
        return self.tokenizer.decode(self.ids[prompt, chat][:tokens], skip_special_tokens=True)


def reference_of(lm, tokenizer, prompts: list[str]) -> Reference:
    """Each prompt decoded alone by the target in process (plain greedy decoding, no proposer)."""
    from specdec import generate
    from specdec.prompts.chat import encode_messages, encode_prompt

    ref = Reference(tokenizer)
    for prompt in prompts:
        for chat in (False, True):
            ids = encode_messages(tokenizer, [{"role": "user", "content": prompt}]) if chat else \
                encode_prompt(tokenizer, prompt, raw=True)
            ref.ids[prompt, chat] = generate(lm, ids, max_new_tokens=MAX_TOKENS, eos_token_id=[]).new_tokens
    return ref


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' server on one thread (conftest.one_thread)."""


def test_soak_300_requests(tmp_path):
    running = start_native(tmp_path, *SERVER_FLAGS, "--max-body-bytes", str(BODY_LIMIT))
    try:
        short = ["a b c d e a b c", "x y z", "Q R S T a b"]
        long = [" ".join(f"w{i} v{i % 7}" for i in range(130))]  # about 400 tokens
        lm, tokenizer = target_alone(tmp_path)
        figures = soak(running, reference_of(lm, tokenizer, short + long), short, long, 300, bad=True,
                       second_half_mib=32)
    finally:
        stop(running)
    print(json.dumps(figures))


def soak(running, ref: Reference, short: list[str], long: list[str], requests: int, bad: bool,
         second_half_mib: float | None = None) -> dict:
    """`requests` requests to `running` as the module docstring says (bad inputs only if `bad`);
    asserts what it says and returns the outcomes and seconds."""
    process = psutil.Process()
    before = running.metrics()
    started = time.monotonic()

    def run(indices) -> list[tuple[str, int]]:
        with Clients(running) as clients, ThreadPoolExecutor(AT_ONCE, thread_name_prefix="soak-client") as pool:
            return list(pool.map(lambda i: one(clients, ref, short, long, i, bad), indices))

    outcomes = run(range(10))
    settle(running, before, outcomes)
    base = (process.memory_info().rss, threads(), len(os.listdir("/proc/self/fd")))
    half = requests // 2
    outcomes += run(range(10, half))
    mid_rss = process.memory_info().rss
    outcomes += run(range(half, requests))
    seconds = time.monotonic() - started
    settle(running, before, outcomes)

    sent = {o: sum(1 for k, _ in outcomes if k == o) for o in {k for k, _ in outcomes}}
    assert sent.get("error", 0) == 0, sent
    stages = check_metrics(running, before, outcomes)
    assert httpx.get(f"{running.url}/health").status_code == 200
    prompt = short[0]
    reply = httpx.post(f"{running.url}/v1/completions", timeout=120, json={
        "model": running.name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 0,
        "return_tokens_as_token_ids": True, "ignore_eos": True}).json()
    assert token_ids(reply["choices"][0]["logprobs"]["tokens"]) == ref.ids[prompt, False][:16]

    rss, (named, pool) = process.memory_info().rss, threads()
    assert rss < 1.1 * base[0], f"resident memory {base[0] >> 20} MiB after 10 requests, {rss >> 20} MiB after all"
    if second_half_mib is not None:
        assert rss - mid_rss < second_half_mib * 2**20, "resident memory grew over the second half of the soak"
    assert named == base[1][0], f"new threads: {sorted(set(named) - set(base[1][0]))[:5]}"
    assert pool <= AT_ONCE + 1, f"{pool} anyio pool workers for {AT_ONCE} clients"
    fds = wait_until(lambda: len(os.listdir("/proc/self/fd")), lambda n: n <= base[2], 10)
    assert fds <= base[2], f"{base[2]} file descriptors open after 10 requests, {fds} after all"
    return {"requests": requests, "seconds": round(seconds, 1), "rss_mib": [base[0] >> 20, rss >> 20], **sent,
            "cancelled_while": stages}


def one(clients: Clients, ref: Reference, short: list[str], long: list[str], i: int, bad: bool) -> tuple[str, int]:
    """Request i: what happened to it ("answered", "left", "bad:<reason>") and its tokens."""
    rng = random.Random(i)
    if bad and i % 10 == 9:
        return send_bad(clients, i)
    if i % 3 == 2:
        return leave(clients, rng, short, long)
    prompt = rng.choice(long if rng.random() < 0.3 else short)
    chat, streamed, tokens = rng.random() < 0.5, rng.random() < 0.5, rng.randint(1, MAX_TOKENS)
    sampled = i % 4 == 0
    text, ids, used = ask(clients, prompt, chat, streamed, tokens, sampled, seed=i)
    assert used == tokens, (i, used, tokens)
    if not sampled:
        if ids is not None:
            assert ids == ref.ids[prompt, chat][:tokens], (i, ids)
        assert text == ref.text(prompt, chat, tokens), (i, text, ref.text(prompt, chat, tokens))
    return "answered", used


def ask(clients: Clients, prompt: str, chat: bool, streamed: bool, tokens: int, sampled: bool,
        seed: int) -> tuple[str, list[int] | None, int]:
    """One request through the openai client: its text, token ids (where the reply carries them)
    and completion tokens."""
    c, name = clients.openai, clients.name
    kw = {"max_tokens": tokens, "temperature": 0.8 if sampled else 0, "seed": seed}
    extra = {"ignore_eos": True}
    if chat:
        messages = [{"role": "user", "content": prompt}]
        if streamed:
            chunks = list(c.chat.completions.create(model=name, messages=messages, stream=True, extra_body=extra,
                                                    stream_options={"include_usage": True}, **kw))
            return "".join(x.choices[0].delta.content or "" for x in chunks if x.choices), None, \
                chunks[-1].usage.completion_tokens
        reply = c.chat.completions.create(model=name, messages=messages, extra_body=extra, **kw)
        return reply.choices[0].message.content, None, reply.usage.completion_tokens
    if streamed:
        chunks = list(c.completions.create(model=name, prompt=prompt, stream=True, extra_body=extra,
                                           stream_options={"include_usage": True}, **kw))
        return "".join(x.choices[0].text for x in chunks if x.choices), None, chunks[-1].usage.completion_tokens
    reply = c.completions.create(model=name, prompt=prompt, logprobs=0,
                                 extra_body={**extra, "return_tokens_as_token_ids": True}, **kw)
    return reply.choices[0].text, token_ids(reply.choices[0].logprobs.tokens), reply.usage.completion_tokens


def leave(clients: Clients, rng: random.Random, short: list[str], long: list[str]) -> tuple[str, int]:
    """A client that leaves while its request waits, prefills or decodes."""
    stage = rng.choice(["queued", "prefilling", "decoding"])
    body = {"model": clients.name, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    if stage == "queued":  # the whole body sent, then the connection closed
        try:
            httpx.post(f"{clients.url}/v1/completions", json={**body, "prompt": rng.choice(short)},
                       timeout=httpx.Timeout(30, read=rng.uniform(0.001, 0.05)))
        except httpx.ReadTimeout:
            pass
    elif stage == "prefilling":  # the reply's headers come before the first token
        with clients.http.stream("POST", "/v1/completions", json={**body, "prompt": long[0], "stream": True}):
            pass
    else:
        stream = clients.openai.completions.create(model=clients.name, prompt=rng.choice(short + long), stream=True,
                                                   max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        for _ in range(rng.randint(1, 3)):
            next(chunks)
        stream.close()
    return "left", 0


def send_bad(clients: Clients, i: int) -> tuple[str, int]:
    body, status, reason = BAD[(i // 10) % len(BAD)]
    reply = (clients.http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
             if isinstance(body, bytes) else clients.http.post("/v1/completions", json={"model": clients.name, **body}))
    assert reply.status_code == status, (i, reply.text[:200])
    assert reply.json()["error"]["message"]
    return f"bad:{reason}", 0


class Clients:
    """The soak's openai and httpx clients, closed (their connections with them) on exit."""

    def __init__(self, running):
        self.url, self.name = running.url, running.name
        self.openai = running.client(timeout=300)
        self.http = httpx.Client(base_url=running.url, timeout=300)

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc) -> None:
        self.openai.close()
        self.http.close()


def grew(running, before: dict, name: str, *labels: str) -> float:
    return running.metrics().get((name, *labels), 0) - before.get((name, *labels), 0)


def ended(running, before: dict) -> float:
    return sum(grew(running, before, "specdec:requests_total", o) for o in ("stop", "length", "cancelled", "error"))


def settle(running, before: dict, outcomes: list[tuple[str, int]]) -> None:
    """Wait until the server has counted every request sent so far (a client's leaving is seen
    at the worker's next round)."""
    decoded = sum(1 for k, _ in outcomes if not k.startswith("bad:"))
    wait_until(lambda: ended(running, before), lambda n: n >= decoded, 60)
    assert ended(running, before) == decoded, f"{ended(running, before)} of {decoded} requests ended"


def check_metrics(running, before: dict, outcomes: list[tuple[str, int]]) -> dict[str, float]:
    """Asserts the counts the module docstring names; the requests cancelled at each stage."""
    count = lambda kind: sum(1 for k, _ in outcomes if k == kind)
    answered, left = count("answered"), count("left")
    g = lambda name, *labels: grew(running, before, name, *labels)
    assert g("specdec:requests_total", "error") == 0
    finished = g("specdec:requests_total", "stop") + g("specdec:requests_total", "length")
    cancelled = g("specdec:requests_total", "cancelled")
    assert finished + cancelled == answered + left and answered <= finished <= answered + left
    for reason in ("invalid", "too_large"):
        assert g("specdec:requests_rejected_total", reason) == count(f"bad:{reason}"), reason
    answered_tokens = sum(n for k, n in outcomes if k == "answered")
    assert answered_tokens <= g("specdec:generation_tokens_total") <= answered_tokens + left * MAX_TOKENS
    # the stages clients left at: never started (no queue time observed), started without a first
    # token (prefilling), cancelled after tokens
    starts, firsts = g("specdec:request_queue_time_seconds_count"), g("specdec:time_to_first_token_seconds_count")
    stages = {"queued": answered + left - starts, "prefilling": starts - firsts,
              "decoding": cancelled - (answered + left - starts) - (starts - firsts)}
    assert stages["queued"] > 0 and stages["decoding"] > 0, stages
    after = running.metrics()
    assert after[("specdec:num_requests_running",)] == 0 and after[("specdec:num_requests_waiting",)] == 0
    return stages


def token_ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def threads() -> tuple[list[str], int]:
    """This process's threads: the names of all but the soak's client threads and anyio's pool
    workers (which run each request's parsing: as many as were parsed at once, reused, ended after
    10 s idle), and the number of pool workers."""
    names = [t.name for t in threading.enumerate() if not t.name.startswith("soak-client")]
    pool = [n for n in names if n.startswith("AnyIO worker")]
    return sorted(n for n in names if n not in pool), len(pool)


def wait_until(read, done, seconds: float):
    """read() until done(value) or `seconds` pass; the last value."""
    deadline = time.monotonic() + seconds
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value
