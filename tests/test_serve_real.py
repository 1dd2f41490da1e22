"""`specdec serve` with the real default pair (the registry's GGUF target and draft, cached in
~/.cache/specdec, as `specdec serve` runs with no model options: `auto`'s method on the native
runtime), through the official openai client: chat and completions, streamed and not, 32 greedy
tokens of three prompts. Each output equals specdec's own plain decoding of the same prompt
tokens in process (specdec.decode.engine.generate without a drafter, on the target runtime the
server loaded: the pair is loaded once), token for token where the reply carries ids and text
for text where it streams; every reply carries its usage and its speculation figures.

test_soak_on_the_real_pair runs tests/test_serve_soak.py's bounded soak on the pair: REQUESTS
requests of mixed length, 6 clients at once against --max-sequences 4, a third left by their
clients while queued, prefilling or decoding; greedy replies equal to each prompt decoded alone
in process, memory, threads and file descriptors flat (see that module's docstring). 300
requests took 164 s (plus 15 s for the references, 7 s to start on a warm cache) on the 2-core
Zen 5 while other work ran; resident memory 2654 MiB after 10 requests, 2670 MiB after 300.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_native import Running
from test_serve_soak import reference_of, soak

pytestmark = pytest.mark.real

PROMPTS = {
    "code": "Write a Python function that merges two sorted lists into one sorted list.",
    "chat": "What are three good habits for staying focused while working from home?",
    "translation": "Translate to German: The weather is nice today, so we are going to the lake.",
}
TOKENS = 32
REQUESTS = 300  # the soak's (test_soak_on_the_real_pair)
SHORT = ["Write a Python function that reverses a string.", "Name three colours of the rainbow."]
LONG = [" ".join(f"Step {i}: add {i} to the total and write the result down." for i in range(20))]  # ~250 tokens


@pytest.fixture(scope="module")
def server():
    from specdec.cli import build_parser
    from specdec.cli.serve import build_server
    from specdec.serve.server import bound_socket

    # --kv-tokens: the soak's budget, which the prefix cache fills early (see test_serve_soak's SERVER_FLAGS)
    args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "warning", "--max-sequences", "4",
                                      "--kv-tokens", "2048"])
    uvicorn_server, worker = build_server(args)
    sock = bound_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    worker.start()
    threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 600  # a first run reads the GGUF files (about a minute)
    while True:
        assert worker.state != "failed", worker.load_error
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"the server did not get ready: {worker.state}"
        time.sleep(0.2)
    yield Running(url, args.target, worker, uvicorn_server)
    uvicorn_server.should_exit = True
    worker.stop()
    worker.join(30)
    worker.loaded = None  # the pair's memory goes with the module, before the next real test loads its own


def plain(worker, ids: list[int]) -> list[int]:
    """specdec's plain decoding in process, on the target runtime the server decodes with (called
    while the server is idle)."""
    from specdec.decode.engine import generate

    return generate(worker.loaded.lm, ids, max_new_tokens=TOKENS).new_tokens


def check_figures(usage, timings: dict, prompt_ids: list[int], tokens: list[int] | int) -> None:
    n = tokens if isinstance(tokens, int) else len(tokens)
    assert usage.prompt_tokens == len(prompt_ids) and usage.completion_tokens == n
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # prompt_n: the prompt tokens forwarded, cache_n those the prefix cache held (llama-server's)
    assert usage.prompt_tokens_details.cached_tokens == timings["cache_n"]
    assert timings["prompt_n"] + timings["cache_n"] == len(prompt_ids) and timings["predicted_n"] == n
    assert timings["rounds"] > 0 and timings["predicted_per_second"] > 0 and timings["prompt_ms"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert sum(timings["accepted_per_position"]) == timings["draft_n_accepted"]
    assert {"propose", "verify", "accept"} <= set(timings["phase_ms"])
    assert timings["method"]


def test_real_pair_served_equals_plain_decoding(server):
    from specdec.prompts.chat import encode_prompt

    client, name, worker = server.client(timeout=300), server.name, server.worker
    tokenizer = worker.loaded.tokenizer
    replies = {}
    for task, text in PROMPTS.items():  # every request first, then plain decoding in process
        messages = [{"role": "user", "content": text}]
        replies[task] = {
            "completion": client.completions.create(model=name, prompt=text, max_tokens=TOKENS, temperature=0,
                                                    logprobs=0, extra_body={"return_tokens_as_token_ids": True}),
            "completion_stream": list(client.completions.create(
                model=name, prompt=text, max_tokens=TOKENS, temperature=0, stream=True,
                stream_options={"include_usage": True})),
            "chat": client.chat.completions.create(model=name, messages=messages, max_tokens=TOKENS, temperature=0,
                                                   logprobs=True),
            "chat_stream": list(client.chat.completions.create(
                model=name, messages=messages, max_tokens=TOKENS, temperature=0, stream=True,
                stream_options={"include_usage": True})),
        }
    drafted = 0
    for task, text in PROMPTS.items():
        r = replies[task]
        raw_ids, chat_ids = encode_prompt(tokenizer, text, raw=True), encode_prompt(tokenizer, text)
        raw_plain, chat_plain = plain(worker, raw_ids), plain(worker, chat_ids)
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)

        whole = r["completion"]
        ids = [int(t.removeprefix("token_id:")) for t in whole.choices[0].logprobs.tokens]
        assert ids == raw_plain, f"{task}: completions"
        assert whole.choices[0].text == decode(raw_plain)
        check_figures(whole.usage, whole.model_extra["timings"], raw_ids, raw_plain)
        drafted += whole.model_extra["timings"]["draft_n"]

        chunks = r["completion_stream"]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == decode(raw_plain), f"{task}: streamed"
        check_figures(chunks[-1].usage, chunks[-1].model_extra["timings"], raw_ids, raw_plain)

        chat = r["chat"]
        assert [e.model_extra["id"] for e in chat.choices[0].logprobs.content] == chat_plain, f"{task}: chat"
        assert chat.choices[0].message.content == decode(chat_plain)
        check_figures(chat.usage, chat.model_extra["timings"], chat_ids, chat_plain)
        drafted += chat.model_extra["timings"]["draft_n"]

        chunks = r["chat_stream"]
        text_out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text_out == decode(chat_plain), f"{task}: chat streamed"
        check_figures(chunks[-1].usage, chunks[-1].model_extra["timings"], chat_ids, chat_plain)
    if worker.loaded.drafter is not None:  # the default method speculates on this machine
        assert drafted > 0


def test_soak_on_the_real_pair(server):
    reference = reference_of(server.worker.loaded.lm, server.worker.loaded.tokenizer, SHORT + LONG)  # while idle
    print(soak(server, reference, SHORT, LONG, REQUESTS, bad=False))
