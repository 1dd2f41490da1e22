"""A bounded soak of `specdec serve` (issue 33): 200 requests, 4 at a time, against a tiny-model
server (the folders and server of test_serve.py: draft:k=3, float32, on 127.0.0.1).

The mix, by request number i: every tenth (i % 10 == 9) bad input, each answered with its 4xx
status (malformed JSON, max_tokens 0, an unknown model: 404, a token id outside the vocabulary,
a body over the server's --max-body-bytes: 413); two in ten (i % 10 in 3, 7) streams of 480
tokens closed by the client after the first chunk (chat and completions); the rest answered:
completions and chat, streamed and not, greedy (each text equal to the target's own greedy
decoding of its prompt, in process) and sampled, 6 to 20 tokens.

Afterwards: /health 200; the /metrics counters account for every request (stop + length =
answered, cancelled = closed, error = 0, so finished + cancelled + errors = the 180 requests that
decoded; rejected by reason = the 20 bad ones; generated tokens at least the answered ones);
nothing left running or waiting; a greedy request still equals the target's own greedy
decoding in process; no growth in the process's threads (the same named threads after the
second half as after the first, and no more of uvicorn's pool workers than requests at once)
or its resident memory (< 32 MiB from the first half to the second).

About 15 s on 2 cores (25 s with start-up), so it runs with the default tests.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from test_serve import PROMPT, WORDS, folders, resident_mib, start, stop  # noqa: F401 - folders: a fixture

REQUESTS, AT_ONCE = 200, 4
PROMPTS = [PROMPT, "x y z", " ".join(WORDS[10:22]), "Q R S T a b"]
GREEDY_TOKENS = 20
LONG = 480  # tokens of a stream the client closes after its first chunk
BODY_LIMIT = 1 << 16
BAD = [  # (body or raw bytes, status, reason counted in requests_rejected)
    (b"{not json", 400, "invalid"),
    ({"prompt": PROMPT, "max_tokens": 0}, 400, "invalid"),
    ({"prompt": PROMPT, "model": "gpt-4"}, 404, "invalid"),
    ({"prompt": [1, 2, 640]}, 400, "invalid"),
    ({"prompt": "a " * BODY_LIMIT}, 413, "too_large"),
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


def plain_greedy(folder: str, prompts: list[str], tokens: int) -> dict[str, tuple[list[int], object]]:
    """The target's own greedy decoding of each prompt, in process (a fresh model from the served
    folder): its token ids, and the tokenizer that turns them into text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec import generate

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return {p: (generate(model, tokenizer(p)["input_ids"], max_new_tokens=tokens, eos_token_id=[]).new_tokens,
                tokenizer) for p in prompts}


def threads() -> tuple[list[str], int]:
    """This process's threads: the names of all but the soak's client threads and uvicorn's pool
    workers, and the number of pool workers (anyio's, which run each request's parsing: as many
    as requests were parsed at once, reused, ended after 10 s idle)."""
    names = [t.name for t in threading.enumerate() if not t.name.startswith("soak-client")]
    pool = [n for n in names if n.startswith("AnyIO worker")]
    return sorted(n for n in names if n not in pool), len(pool)


def test_soak_200_requests(folders):  # noqa: F811 - the fixture imported from test_serve
    running = start(folders, "--max-queue", "8", "--max-body-bytes", str(BODY_LIMIT))
    try:
        soak(running, folders)
    finally:
        stop(running)


def soak(running, served_folders: tuple[str, str]) -> None:
    client = running.client(timeout=60)
    http = httpx.Client(base_url=running.url, timeout=60)
    reference = plain_greedy(served_folders[0], PROMPTS, GREEDY_TOKENS)

    def greedy_text(prompt: str, tokens: int) -> str:
        ids, tokenizer = reference[prompt]
        return tokenizer.decode(ids[:tokens], skip_special_tokens=True)

    before = running.metrics()
    started = time.monotonic()

    def one(i: int) -> tuple[str, int]:
        """Request i; what happened to it and the tokens it returned."""
        prompt = PROMPTS[i % len(PROMPTS)]
        tokens = 6 + i % (GREEDY_TOKENS - 5)
        if i % 10 == 9:
            body, status, reason = BAD[(i // 10) % len(BAD)]
            reply = (http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
                     if isinstance(body, bytes)
                     else http.post("/v1/completions", json={"model": running.name, **body}))
            assert reply.status_code == status, (i, reply.text[:200])
            assert reply.json()["error"]["message"]
            return f"bad:{reason}", 0
        if i % 10 in (3, 7):
            if i % 20 < 10:
                stream = client.completions.create(model=running.name, prompt=prompt, max_tokens=LONG, stream=True,
                                                   temperature=0)
            else:
                stream = client.chat.completions.create(model=running.name, messages=[{"role": "user",
                                                        "content": prompt}], max_tokens=LONG, stream=True, seed=i,
                                                        temperature=0.8)
            next(iter(stream))
            stream.close()
            return "closed", 0
        sampled = i % 3 == 0
        kw = {"max_tokens": tokens, "temperature": 0.8 if sampled else 0, "seed": i}
        chat, streamed = i % 2 == 1, i % 4 >= 2
        if chat:
            messages = [{"role": "user", "content": prompt}]
            if streamed:
                chunks = list(client.chat.completions.create(model=running.name, messages=messages, stream=True,
                                                             stream_options={"include_usage": True}, **kw))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                used = chunks[-1].usage.completion_tokens
            else:
                reply = client.chat.completions.create(model=running.name, messages=messages, **kw)
                text, used = reply.choices[0].message.content, reply.usage.completion_tokens
        elif streamed:
            chunks = list(client.completions.create(model=running.name, prompt=prompt, stream=True,
                                                    stream_options={"include_usage": True}, **kw))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            used = chunks[-1].usage.completion_tokens
        else:
            reply = client.completions.create(model=running.name, prompt=prompt, **kw)
            text, used = reply.choices[0].text, reply.usage.completion_tokens
        assert used == tokens, (i, used)
        if not sampled:  # chat has no template here: the same prompt tokens as completions
            assert text == greedy_text(prompt, tokens), (i, text, greedy_text(prompt, tokens))
        return "answered", used

    with ThreadPoolExecutor(AT_ONCE, thread_name_prefix="soak-client") as pool:
        first = list(pool.map(one, range(REQUESTS // 2)))
        threads_then, memory = threads(), resident_mib()
        second = list(pool.map(one, range(REQUESTS // 2, REQUESTS)))
    outcomes = [o for o, _ in first + second]
    answered_tokens = sum(n for _, n in first + second)
    seconds = time.monotonic() - started

    sent = {o: outcomes.count(o) for o in set(outcomes)}
    assert sent["answered"] == 140 and sent["closed"] == 40 and sent["bad:invalid"] + sent["bad:too_large"] == 20
    grew = lambda name, *labels: running.metrics().get((name, *labels), 0) - before.get((name, *labels), 0)
    ended = lambda: sum(grew("specdec:requests_total", o) for o in ("stop", "length", "cancelled", "error"))
    deadline = time.monotonic() + 30
    while ended() < sent["answered"] + sent["closed"]:  # a closed stream is counted at the worker's next round
        assert time.monotonic() < deadline, f"{ended()} of {sent['answered'] + sent['closed']} requests ended"
        time.sleep(0.05)
    after = running.metrics()
    assert grew("specdec:requests_total", "stop") + grew("specdec:requests_total", "length") == sent["answered"]
    assert grew("specdec:requests_total", "cancelled") == sent["closed"]
    assert grew("specdec:requests_total", "error") == 0
    assert ended() == REQUESTS - 20  # finished + cancelled + errors = the requests that decoded
    for reason in ("invalid", "too_large"):
        assert grew("specdec:requests_rejected_total", reason) == sent[f"bad:{reason}"], reason
    generated = grew("specdec:generation_tokens_total")
    assert answered_tokens <= generated < answered_tokens + sent["closed"] * LONG
    assert after[("specdec:num_requests_running",)] == 0 and after[("specdec:num_requests_waiting",)] == 0
    assert http.get("/health").status_code == 200

    # still decoding correctly: greedy equals the target's own greedy decoding, in process
    reply = http.post("/v1/completions", json={"model": running.name, "prompt": PROMPT, "max_tokens": GREEDY_TOKENS,
                                                "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True})
    served = [int(t.removeprefix("token_id:")) for t in reply.json()["choices"][0]["logprobs"]["tokens"]]
    assert served == reference[PROMPT][0]

    named, pool = threads()
    new = sorted(set(named) - set(threads_then[0]))
    assert named == threads_then[0], f"{len(threads_then[0])} threads after the first half, {len(named)} after " \
                                     f"the second; new: {new[:5]}"
    assert max(pool, threads_then[1]) <= AT_ONCE + 1, f"{pool} pool workers for {AT_ONCE} clients"
    assert resident_mib() - memory < 32, "resident memory grew over the second half of the soak"
    print(json.dumps({"requests": REQUESTS, "seconds": round(seconds, 1), **sent}))
