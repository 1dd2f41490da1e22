"""`n` > 1 through `specdec serve` with the official openai client, on the tiny GGUF pair
(tests/serve_native.py) written with Qwen2.5's chat template and its tool-call tokens (as
tests/test_serve_tools.py), draft:k=3, `--no-plan` (each sequence guesses k=3 whatever else runs,
so a seeded choice draws the same random numbers beside its siblings as alone; and every prompt
is prefilled when it starts) and `--kv-tokens 4096` (small enough that n choices of a long answer
do not fit); greedy and the shared prompt also on a server with the batch plan (prompts then
join the rounds in chunks: choice 0's prompt is not forwarded yet when the others could start).

What must hold:
- greedy: the n choices each equal the n=1 reply (text, finish_reason), indices 0..n-1;
- seeded sampling: choice i equals a lone request with seed + i; the choices differ (temperature
  1 over the random model's 2,176 tokens, 24 tokens each: two equal choices have a probability
  far below 1e-9, and the seeds are fixed, so a run repeats exactly);
- streamed chunks reassembled per index equal the whole reply's choices; each choice has one
  chunk with a finish_reason; the usage chunk comes once, last;
- usage: the prompt counted once, the completion tokens summed over the choices (each choice's
  tokens counted from its logprobs entries);
- the prompt is forwarded once: choice 0 forwards it, every other choice takes all of it but
  its last token from choice 0's lane (timings.cache_n, timings.prompt_n == 1, and /metrics'
  prefix-cache counters and prompt-token counter); with --no-prefix-cache each choice forwards
  it, the answers the same;
- n out of range, best_of other than n, and n choices past the K/V budget are 400s naming the field;
- tools: each choice is a call, equal to the n=1 reply, streamed and whole alike;
- a client that leaves a streamed n=3 reply frees all three sequences.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from serve_native import start_native, stop
from test_serve_tools import ASK, CLOCK, FORECAST, TOKEN_LIST
from test_tools import QWEN

PROMPT = "def fibonacci(n):"
TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = start_native(tmp_path_factory, "--no-plan", "--kv-tokens", "4096", template=QWEN, tokens=TOKEN_LIST)
    yield running
    stop(running)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    running = start_native(tmp_path_factory, template=QWEN, tokens=TOKEN_LIST)
    yield running
    stop(running)


@pytest.fixture(scope="module")
def uncached(tmp_path_factory):
    running = start_native(tmp_path_factory, "--no-prefix-cache", template=QWEN, tokens=TOKEN_LIST)
    yield running
    stop(running)


@pytest.fixture(params=["no-plan", "plan"])
def server(request, served, planned):
    return served if request.param == "no-plan" else planned


def _complete(served, **body):
    """A completions reply of PROMPT, TOKENS tokens unless `body` says otherwise."""
    body = {"model": served.name, "prompt": PROMPT, "max_tokens": TOKENS, "extra_body": {"ignore_eos": True}, **body}
    return served.client().completions.create(**body)


def _texts(reply) -> list[str]:
    assert [c.index for c in reply.choices] == list(range(len(reply.choices)))
    return [c.text for c in reply.choices]


def test_greedy_choices_each_equal_the_single_reply(server):
    one = _complete(server, temperature=0)
    three = _complete(server, temperature=0, n=3)
    assert _texts(three) == _texts(one) * 3 and one.choices[0].text
    assert [c.finish_reason for c in three.choices] == ["length"] * 3
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens == 3 * TOKENS

    chat = server.client().chat.completions
    single = chat.create(model=server.name, messages=ASK, max_tokens=TOKENS, temperature=0)
    many = chat.create(model=server.name, messages=ASK, max_tokens=TOKENS, temperature=0, n=2)
    assert [c.message.content for c in many.choices] == [single.choices[0].message.content] * 2
    assert [c.finish_reason for c in many.choices] == [single.choices[0].finish_reason] * 2
    assert many.usage.prompt_tokens == single.usage.prompt_tokens


def test_seeded_choice_i_is_the_lone_request_with_seed_plus_i(served):
    seed, n = 1234, 3
    many = _complete(served, temperature=1.0, seed=seed, n=n)
    alone = [_complete(served, temperature=1.0, seed=seed + i).choices[0].text for i in range(n)]
    assert _texts(many) == alone
    assert len(set(alone)) == n  # the choices differ from each other


def test_streamed_choices_reassemble_to_the_whole_reply(served):
    body = dict(temperature=1.0, seed=77, n=3, logprobs=0)
    whole = _complete(served, **body)
    chunks = list(_complete(served, stream=True, stream_options={"include_usage": True}, **body))
    texts, finishes = ["", "", ""], [[], [], []]
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1 and chunk.usage is None
        choice = chunk.choices[0]
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == _texts(whole) and finishes == [["length"]] * 3
    last = chunks[-1]
    assert last.choices == [] and last.usage.model_dump() == whole.usage.model_dump()

    chat = dict(model=served.name, messages=ASK, max_tokens=TOKENS, temperature=1.0, seed=5, n=3)
    reply = served.client().chat.completions.create(**chat)
    state = ChatCompletionStreamState()
    for chunk in served.client().chat.completions.create(stream=True, **chat):
        list(state.handle_chunk(chunk))
    snapshot = state.current_completion_snapshot
    assert [(c.index, c.message.content, c.finish_reason) for c in snapshot.choices] == \
        [(c.index, c.message.content, c.finish_reason) for c in reply.choices]
    assert len({c.message.content for c in reply.choices}) == 3


def test_usage_counts_the_prompt_once_and_every_choices_tokens(served):
    """Choices of different lengths (a stop string ends some early): completion_tokens is the sum
    of the tokens each choice returned, read from its logprobs entries."""
    reply = served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=TOKENS, temperature=1.0,
                                               seed=9, n=4, logprobs=0, stop=["e"])
    lone = _complete(served, max_tokens=1)
    counts = [len(c.logprobs.tokens) for c in reply.choices]
    assert reply.usage.completion_tokens == sum(counts) and reply.usage.prompt_tokens == lone.usage.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + sum(counts)
    assert [c.model_extra["timings"]["predicted_n"] for c in reply.choices] == counts


def test_the_prompt_is_forwarded_once(server):
    """A prompt of token ids no earlier request held: choice 0 forwards all of it, the other three
    take all but the last token from its lane (cache_n) and forward one (prompt_n)."""
    ids = random.Random(3).sample(range(300, 2000), 40)
    before = server.metrics()
    reply = server.client().completions.create(model=server.name, prompt=ids, max_tokens=8, temperature=0, n=4)
    after = server.metrics()
    timings = [c.model_extra["timings"] for c in reply.choices]
    assert (timings[0]["cache_n"], timings[0]["prompt_n"]) == (0, len(ids))
    assert [(t["cache_n"], t["prompt_n"]) for t in timings[1:]] == [(len(ids) - 1, 1)] * 3
    assert reply.model_extra["timings"] == timings[0]
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.prompt_tokens_details.cached_tokens == 0

    def grew(name):
        return after[(name,)] - before[(name,)]

    assert grew("specdec:prefix_cache_queries_total") == 4 * len(ids)
    assert grew("specdec:prefix_cache_hits_total") == 3 * (len(ids) - 1)
    assert grew("specdec:prompt_tokens_total") == len(ids)  # once per request, as usage counts it
    assert grew("specdec:generation_tokens_total") == reply.usage.completion_tokens == 32


def test_without_the_prefix_cache_every_choice_forwards_the_prompt(uncached, served):
    """--no-prefix-cache: the n choices start at once, each forwarding the whole prompt; the
    answers are those of the server with the cache."""
    ids = random.Random(4).sample(range(300, 2000), 20)
    reply = uncached.client().completions.create(model=uncached.name, prompt=ids, max_tokens=8, temperature=0, n=3)
    cached = served.client().completions.create(model=served.name, prompt=ids, max_tokens=8, temperature=0, n=3)
    assert [(c.model_extra["timings"]["cache_n"], c.model_extra["timings"]["prompt_n"]) for c in reply.choices] == \
        [(0, len(ids))] * 3
    assert _texts(reply) == _texts(cached) and len(set(_texts(reply))) == 1
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == 24


@pytest.mark.parametrize("body,param,message", [
    ({"n": 17}, "n", "n must be between 1 and 16"),
    ({"n": 0}, "n", "n must be between 1 and 16"),
    ({"n": "3"}, "n", "n must be an integer"),
    ({"n": 2, "best_of": 3}, "best_of", "best_of other than n is not supported"),
    ({"n": 3, "max_tokens": 1500}, "n", "lower n or max_tokens"),
])
def test_bad_n_is_a_400_naming_the_field(served, body, param, message):
    reply = httpx.post(f"{served.url}/v1/completions", json={"model": served.name, "prompt": PROMPT, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["param"] == param


def test_the_prompt_counts_once_against_the_kv_budget(served):
    """Three choices of a 1,300-token prompt: each holding a prompt of its own (3 x 1,408
    positions) would pass --kv-tokens 4096; read in place by the later choices, the prompt counts
    once (1,408 + 2 x 128)."""
    prompt = [5 + i % 40 for i in range(1300)]
    reply = _complete(served, prompt=prompt, n=3, max_tokens=80)
    assert [c.finish_reason for c in reply.choices] == ["length"] * 3
    assert reply.usage.prompt_tokens == 1300 and reply.usage.completion_tokens == 240


def test_best_of_equal_to_n_and_one_choice_of_a_long_answer_are_taken(served):
    assert len(_complete(served, n=2, extra_body={"best_of": 2}, max_tokens=2).choices) == 2
    assert _complete(served, max_tokens=1500).usage.completion_tokens == 1500  # alone it fits the budget


def test_every_choice_is_a_call_equal_to_the_single_reply(served):
    def calls(choice):
        return [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]

    body = dict(model=served.name, messages=ASK, max_tokens=60, temperature=0, tools=[FORECAST, CLOCK],
                tool_choice="required", parallel_tool_calls=False)
    chat = served.client().chat.completions
    single = chat.create(**body).choices[0]
    many = chat.create(n=3, **body)
    state = ChatCompletionStreamState()
    for chunk in chat.create(stream=True, n=3, **body):
        list(state.handle_chunk(chunk))
    streamed = state.current_completion_snapshot.choices
    assert len(calls(single)) == 1 and single.finish_reason == "tool_calls"
    for choice in [*many.choices, *streamed]:
        assert calls(choice) == calls(single) and choice.finish_reason == "tool_calls"
    assert [c.index for c in streamed] == [0, 1, 2]


def test_a_client_that_leaves_frees_every_choice(served):
    before = served.metrics()
    with httpx.stream("POST", f"{served.url}/v1/completions", json={
            "model": served.name, "prompt": PROMPT, "max_tokens": 1300, "n": 3, "stream": True, "ignore_eos": True,
            "temperature": 1.0}) as events:
        seen = set()
        for line in events.iter_lines():
            if '"index":' in line:
                seen.add(line.split('"index":')[1][0])
            if len(seen) == 3:  # every choice has started
                break
    worker = served.worker
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (worker.scheduler.idle and not worker._rounds._held):
        time.sleep(0.05)
    assert worker.scheduler.idle and not worker._rounds._held
    after = served.metrics()
    assert after[("specdec:requests_total", "cancelled")] - before[("specdec:requests_total", "cancelled")] == 3
    assert after[("specdec:num_requests_running",)] == 0
    assert after[("specdec:generation_tokens_total",)] - before[("specdec:generation_tokens_total",)] < 3 * 1300
