"""`specdec serve`'s prefix cache on the tiny GGUF pair (tests/serve_native.py), through the openai
client: a conversation whose later turns resend the history reports the tokens the cache held in
usage.prompt_tokens_details.cached_tokens (OpenAI), timings.cache_n with prompt_n counting only
the tokens forwarded (llama-server), and /metrics' prefix_cache_queries and prefix_cache_hits
(vLLM's names, counters of tokens); its answers equal a server's with --no-prefix-cache, which
reports no cached tokens."""

from __future__ import annotations

import pytest
from serve_native import start_native, stop

QUESTIONS = ["Write a function that adds two numbers.", "Now add a docstring to it.", "And a test, please."]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-serve")
    warm = start_native(folder)
    cold = start_native(folder, "--no-prefix-cache")
    yield warm, cold
    stop(warm)
    stop(cold)


def _converse(server, stream: bool) -> list[tuple[str, dict, dict]]:
    """Three turns, each resending the history with the server's own answers: (text, usage,
    timings) per turn."""
    client, messages, turns = server.client(), [], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        kw = dict(model=server.name, messages=messages, max_tokens=12, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage, timings = chunks[-1].usage.model_dump(), chunks[-1].model_extra["timings"]
        else:
            reply = client.chat.completions.create(**kw)
            text, usage, timings = reply.choices[0].message.content, reply.usage.model_dump(), reply.model_extra["timings"]
        messages.append({"role": "assistant", "content": text})
        turns.append((text, usage, timings))
    return turns


def _counters(server) -> tuple[float, float]:
    m = server.metrics()
    return m[("specdec:prefix_cache_queries_total",)], m[("specdec:prefix_cache_hits_total",)]


@pytest.mark.parametrize("stream", [False, True])
def test_later_turns_report_cached_tokens_and_answer_as_without_the_cache(servers, stream):
    warm, cold = servers
    before = _counters(warm)
    with_cache = _converse(warm, stream)
    after = _counters(warm)
    without = _converse(cold, stream)
    assert [t for t, _, _ in with_cache] == [t for t, _, _ in without]
    for (_, usage, timings), (_, plain, plain_timings) in zip(with_cache, without):
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert usage["prompt_tokens"] == plain["prompt_tokens"]
        assert timings["cache_n"] == cached and timings["prompt_n"] == usage["prompt_tokens"] - cached
        assert plain["prompt_tokens_details"] is None and plain_timings["cache_n"] == 0
        assert plain_timings["prompt_n"] == plain["prompt_tokens"]
    first, second, third = (u for _, u, _ in with_cache)
    # Each turn's prompt starts with the one before it (the template's text for the history):
    # the cache held at least all of it, never the new message.
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"]
    assert third["prompt_tokens_details"]["cached_tokens"] >= second["prompt_tokens"]
    assert all(u["prompt_tokens_details"]["cached_tokens"] < u["prompt_tokens"] for u in (first, second, third))
    queried = sum(u["prompt_tokens"] for u in (first, second, third))
    hit = sum(u["prompt_tokens_details"]["cached_tokens"] for u in (first, second, third))
    assert (after[0] - before[0], after[1] - before[1]) == (queried, hit)
    assert _counters(cold) == (0, 0)
