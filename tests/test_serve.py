"""specdec serve through the official openai client, on 127.0.0.1, on specdec's native runtime
with tiny GGUF files (tests/serve_native.py): greedy outputs equal the target's own decoding,
logprobs are the target's, per-request figures agree with the tokens and with /metrics, bad
input gets OpenAI-style errors, clients may leave mid-stream, requests decode together each as
alone. The folders of tiny transformers models here (`folders`, `start`) serve `--runtime hf`
where that runtime is the point (test_hf_runtime_serves; test_serve_sampling's exactness and
test_serve_soak use them too)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from conftest import perturbed, tiny_model
from gguf_files import VOCAB
from serve_native import CONTEXT, METHOD, Running, launch, start_native, stop, target_alone

from specdec.cli import main

# One character per token (AutoTokenizer loads a word-level tokenizer in these folders as Qwen2's
# tokenizer, which keeps one-character words intact, and adds one special token); with <unk> and
# 62 words that fills the tiny vocabulary.
WORDS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
PROMPT = "a b c d e a b c"
NO_EOS = {"ignore_eos": True}  # random weights may pick an end token: replies that count tokens run to the limit


def word_tokenizer():
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(["<unk>", *WORDS])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    """Tiny transformers models saved as folders (target, draft), for `--runtime hf` servers."""
    root = tmp_path_factory.mktemp("serve-models")
    target = tiny_model(1)
    for name, model in (("target", target), ("draft", perturbed(target, seed=2, scale=0.3))):
        model.save_pretrained(root / name)
        word_tokenizer().save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


def model_args(folders, *extra) -> list[str]:
    target, draft = folders
    return ["--target", target, "--draft", draft, "--dtype", "float32", "--runtime", "hf", "--target-quant", "none",
            "--proposer", METHOD, *extra]


def start(folders, *extra) -> Running:
    """A `--runtime hf` server of the tiny folders."""
    return launch(model_args(folders, *extra))


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The folder of the tiny GGUF pair (and its prepared parts)."""
    return tmp_path_factory.mktemp("serve-gguf")


@pytest.fixture(scope="module")
def served(gguf):
    running = start_native(gguf, "--max-queue", "8")
    yield running
    stop(running)


@pytest.fixture(scope="module")
def alone(gguf):
    """The target alone, in this process, and its tokenizer."""
    return target_alone(gguf)


def greedy_alone(alone, prompt_ids: list[int], tokens: int) -> list[int]:
    """The target's own greedy decoding (no proposer), past end tokens."""
    from specdec import generate

    lm, _ = alone
    return generate(lm, prompt_ids, max_new_tokens=tokens, eos_token_id=[]).new_tokens


def encode(alone, text: str) -> list[int]:
    """A completions prompt's ids, as the server encodes it."""
    from specdec.prompts.chat import encode_prompt

    return encode_prompt(alone[1], text, raw=True)


def check_timings(t: dict, completion_tokens: int, k: int = 3) -> None:
    assert t["predicted_n"] == completion_tokens
    assert 0 <= t["draft_n_accepted"] <= t["draft_n"] <= t["rounds"] * k
    assert t["drafts"] <= t["rounds"]
    assert sum(t["accepted_per_position"]) == t["draft_n_accepted"]
    assert t["mean_accepted_length"] == pytest.approx((t["draft_n_accepted"] + t["rounds"]) / t["rounds"])
    assert t["method"] == METHOD and t["prompt_n"] > 0 and t["prompt_ms"] > 0


def ids_of(logprobs_tokens: list[str]) -> list[int]:
    """Token ids from logprobs entries spelled token_id:N (return_tokens_as_token_ids)."""
    return [int(t.split(":")[1]) for t in logprobs_tokens]


# --- output ----------------------------------------------------------------------------------


def test_greedy_completion_equals_the_target_alone(served, alone):
    prompt_ids = encode(alone, PROMPT)
    expected_ids = greedy_alone(alone, prompt_ids, 24)
    expected = alone[1].decode(expected_ids, skip_special_tokens=True)
    client = served.client()
    whole = client.completions.create(model=served.name, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1,
                                      extra_body={**NO_EOS, "return_tokens_as_token_ids": True})
    choice = whole.choices[0]
    assert ids_of(choice.logprobs.tokens) == expected_ids
    assert choice.text == expected and choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens == len(prompt_ids)
    check_timings(whole.model_extra["timings"], 24)
    streamed = list(client.completions.create(model=served.name, prompt=PROMPT, max_tokens=24, temperature=0,
                                              stream=True, stream_options={"include_usage": True}, extra_body=NO_EOS))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected
    assert streamed[-1].usage.completion_tokens == 24 and not streamed[-1].choices
    check_timings(streamed[-1].model_extra["timings"], 24)
    # the same prompt as token ids
    ids = httpx.post(f"{served.url}/v1/completions", json={
        "model": served.name, "prompt": prompt_ids, "max_tokens": 24, "temperature": 0, "logprobs": 0,
        "return_tokens_as_token_ids": True, **NO_EOS}).json()
    assert ids_of(ids["choices"][0]["logprobs"]["tokens"]) == expected_ids


def test_chat_streamed_and_not(served, alone):
    """A chat request's prompt is the model's chat template (SmolLM2's, from the GGUF) over the messages."""
    from specdec.prompts.chat import encode_messages

    messages = [{"role": "user", "content": PROMPT}]
    prompt_ids = encode_messages(alone[1], messages)
    expected = alone[1].decode(greedy_alone(alone, prompt_ids, 16), skip_special_tokens=True)
    client = served.client()
    whole = client.chat.completions.create(model=served.name, messages=messages, max_tokens=16, temperature=0,
                                           extra_body=NO_EOS)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(prompt_ids)
    check_timings(whole.model_extra["timings"], whole.usage.completion_tokens)
    chunks = list(client.chat.completions.create(model=served.name, messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, extra_body=NO_EOS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length"
    assert last.usage.completion_tokens == 16
    check_timings(last.model_extra["timings"], 16)


def test_logprobs_are_the_targets(served, alone):
    """Each returned token's logprob and alternatives are the target's own (log-softmax of its
    logits after the prompt and the tokens before), greedy tokens its top-1."""
    reply = served.client().chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0,
        logprobs=True, top_logprobs=3, extra_body=NO_EOS)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 12
    from specdec.prompts.chat import encode_messages

    ids = encode_messages(alone[1], [{"role": "user", "content": PROMPT}]) + [e.model_extra["id"] for e in entries]
    lm = alone[0]
    lm.release()
    logp = torch.log_softmax(lm.forward(torch.tensor(ids)).float(), -1)
    lm.release()
    start = len(ids) - len(entries) - 1
    for i, e in enumerate(entries):
        row = logp[start + i]
        assert e.logprob == pytest.approx(row[e.model_extra["id"]].item(), abs=1e-3)
        assert [a.model_extra["id"] for a in e.top_logprobs] == row.topk(3).indices.tolist()
        assert e.top_logprobs[0].model_extra["id"] == e.model_extra["id"]  # greedy: the best token


def test_sampling_with_seed_repeats(served):
    client = served.client()
    ask = lambda: client.completions.create(model=served.name, prompt=PROMPT, max_tokens=20, temperature=0.9,
                                            top_p=0.9, seed=7, extra_body={"top_k": 20}).choices[0].text
    assert ask() == ask()


def test_stop_string(served, alone):
    """The reply ends before the stop string's first occurrence; the tokens counted run up to the
    one that completed it."""
    tokenizer = alone[1]
    ids = greedy_alone(alone, encode(alone, PROMPT), 24)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = full.index(stop)
    completed = next(n for n in range(1, 25) if stop in tokenizer.decode(ids[:n], skip_special_tokens=True))
    client = served.client()
    reply = client.completions.create(model=served.name, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                      extra_body=NO_EOS)
    assert reply.choices[0].text == full[:cut] and reply.choices[0].finish_reason == "stop"
    check_timings(reply.model_extra["timings"], reply.usage.completion_tokens)
    assert reply.usage.completion_tokens == completed
    streamed = client.completions.create(model=served.name, prompt=PROMPT, max_tokens=24, temperature=0,
                                         stop=stop, stream=True, extra_body=NO_EOS)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[:cut]


def test_streamed_logprobs_name_every_token(served, alone):
    chunks = list(served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=10, temperature=0,
                                                      logprobs=2, stream=True,
                                                      extra_body={**NO_EOS, "return_tokens_as_token_ids": True}))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(tokens) == 10 and alone[1].decode(ids_of(tokens), skip_special_tokens=True) == text


def test_chat_template_conversation(served, alone, monkeypatch):
    """A conversation goes through the tokenizer's chat template (here a plain one set for the test)."""
    tokenizer = served.worker.loaded.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", "{{ messages | map(attribute='content') | join(' ') }}",
                        raising=False)
    messages = [{"role": "system", "content": "a b"}, {"role": "user", "content": "c d"},
                {"role": "assistant", "content": "e"}, {"role": "user", "content": [{"type": "text", "text": "f"}]}]
    client = served.client()
    chat = client.chat.completions.create(model=served.name, messages=messages, max_tokens=8, temperature=0)
    same = client.completions.create(model=served.name, prompt="a b c d e f", max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens == same.usage.prompt_tokens == len(encode(alone, "a b c d e f"))
    assert chat.choices[0].message.content == same.choices[0].text


def test_min_p_is_taken(served):
    body = {"model": served.name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "min_p": 0.05, "seed": 1,
            **NO_EOS}
    reply = httpx.post(f"{served.url}/v1/completions", json=body)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 6

# --- metrics ---------------------------------------------------------------------------------


def test_metrics_grow_by_one_request(served):
    before = served.metrics()
    reply = served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=30, temperature=0,
                                               extra_body=NO_EOS)
    after = served.metrics()
    t = reply.model_extra["timings"]
    grew = lambda name, *labels: after.get((name, *labels), 0) - before.get((name, *labels), 0)
    assert grew("specdec:requests_total", "length") == 1
    assert grew("specdec:prompt_tokens_total") == reply.usage.prompt_tokens
    assert grew("specdec:generation_tokens_total") == reply.usage.completion_tokens == 30
    assert grew("specdec:spec_decode_num_draft_tokens_total") == t["draft_n"]
    assert grew("specdec:spec_decode_num_accepted_tokens_total") == t["draft_n_accepted"]
    assert grew("specdec:spec_decode_num_drafts_total") == t["drafts"]
    assert grew("specdec:spec_decode_num_rounds_total") == t["rounds"]
    for position, count in enumerate(t["accepted_per_position"]):
        assert grew("specdec:spec_decode_num_accepted_tokens_per_pos_total", str(position)) == count
    assert grew("specdec:time_to_first_token_seconds_count") == 1
    assert grew("specdec:inter_token_latency_seconds_count") == 29
    assert after[("specdec:num_requests_running",)] == 0


def test_models_and_health(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [served.name]
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}


def test_hf_runtime_serves(folders, capsys):
    """`--runtime hf` (a transformers folder) still serves: a greedy completion equals `specdec
    generate` on the same folders, and a tokenizer without a chat template refuses a conversation."""
    assert main(["generate", *model_args(folders), "--prompt", PROMPT, "--max-new-tokens", "16", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    running = start(folders)
    try:
        reply = running.client().completions.create(model=running.name, prompt=PROMPT, max_tokens=16, temperature=0)
        assert reply.choices[0].text == expected["text"] and reply.usage.completion_tokens == 16
        check_timings(reply.model_extra["timings"], 16)
        refused = httpx.post(f"{running.url}/v1/chat/completions", json={"model": running.name, "messages": [
            {"role": "system", "content": "a"}, {"role": "user", "content": "b"}]})
        assert refused.status_code == 400 and "no chat template" in refused.json()["error"]["message"]
    finally:
        stop(running)


# --- bad input -------------------------------------------------------------------------------

BAD = [
    ("completions", {"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ("completions", {"prompt": PROMPT, "max_tokens": -3}, 400, "max_tokens must be >= 1"),
    ("completions", {"prompt": PROMPT, "temperature": -0.5}, 400, "temperature must be >= 0"),
    ("completions", {"prompt": PROMPT, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ("completions", {"prompt": PROMPT, "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ("completions", {"prompt": PROMPT, "n": 17}, 400, "n must be between 1 and 16"),
    ("completions", {"prompt": PROMPT, "presence_penalty": 2.5}, 400, "presence_penalty must be in [-2, 2]"),
    ("completions", {"prompt": PROMPT, "frequency_penalty": -3}, 400, "frequency_penalty must be in [-2, 2]"),
    ("completions", {"prompt": PROMPT, "repetition_penalty": 0}, 400, "repetition_penalty must be > 0"),
    ("completions", {"prompt": PROMPT, "repetition_penalty": 1.2, "repeat_penalty": 1.1}, 400, "send one of them"),
    ("completions", {"prompt": PROMPT, "repeat_last_n": -2}, 400, "repeat_last_n must be between -1"),
    ("completions", {"prompt": PROMPT, "logit_bias": {"3": 101}}, 400, "in [-100, 100]"),
    ("completions", {"prompt": PROMPT, "logit_bias": {"x": 1}}, 400, "keys must be token ids"),
    ("completions", {"prompt": PROMPT, "logit_bias": {str(VOCAB): 1}}, 400, f"token id {VOCAB} is outside"),
    ("completions", {"prompt": PROMPT, "logit_bias": [[3, 1]]}, 400, "logit_bias must be an object"),
    ("completions", {"prompt": ""}, 400, "the prompt is empty"),
    ("completions", {"prompt": "   "}, 400, "the prompt is empty"),
    ("completions", {"prompt": []}, 400, "empty list"),
    ("completions", {"max_tokens": 3}, 400, "prompt is missing"),
    ("completions", {"prompt": [1, 2, VOCAB]}, 400, f"token id {VOCAB} is outside the vocabulary"),
    ("completions", {"prompt": [1, -1]}, 400, "outside the vocabulary"),
    ("completions", {"prompt": ["a b", "c d"]}, 400, "send one prompt per request"),
    ("completions", {"prompt": " ".join(["a"] * (CONTEXT + 10))}, 400, f"context is {CONTEXT}"),
    ("completions", {"prompt": PROMPT, "max_tokens": CONTEXT}, 400, "lower max_tokens to at most"),
    ("completions", {"prompt": PROMPT, "model": "gpt-4"}, 404, "does not exist"),
    ("completions", {"prompt": PROMPT, "stop": 5}, 400, "stop must be a string"),
    ("completions", {"prompt": PROMPT, "temperature": "hot"}, 400, "temperature must be a number"),
    ("completions", {"prompt": PROMPT, "logprobs": 50}, 400, "logprobs must be between"),
    ("completions", {"prompt": PROMPT, "min_p": 1}, 400, "min_p must be in [0, 1)"),
    ("chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
    ("chat/completions", {"prompt": PROMPT}, 400, "messages is missing"),
    ("chat/completions", {"messages": [{"role": "user", "content": " "}]}, 400, "every message is empty"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "a"}]}, 400, "role must be"),
    ("chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}, 400,
     "top_logprobs needs logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "only text parts"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[m for *_, m in BAD])
def test_bad_input_gets_an_openai_error(served, path, body, status, message):
    reply = httpx.post(f"{served.url}/v1/{path}", json={"model": served.name, **body} if "model" not in body else body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_malformed_requests(served):
    as_json = {"Content-Type": "application/json"}
    for content in (b"{not json", b"", b"[1, 2]", "\u00e9".encode("latin-1")):
        reply = httpx.post(f"{served.url}/v1/completions", content=content, headers=as_json)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json", content
    assert httpx.post(f"{served.url}/v1/completions", content=b"x" * (9 << 20), headers=as_json).status_code == 413
    assert httpx.get(f"{served.url}/v1/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{served.url}/v1/completions").status_code == 405
    # the openai client raises its own error classes from these statuses
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
        served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        served.client().completions.create(model="nope", prompt=PROMPT)
    assert served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=2).usage.completion_tokens



FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "n", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n", "echo", "logit_bias",
          "response_format", "grammar", "json_schema", "return_tokens_as_token_ids", "ignore_eos", "user",
          "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"]
ODD_VALUES = [None, "x", -1, 1.5, 10**12, 10**400, -(10**30), 1e300, [1, "a"], {"a": 1}, True]
CHAT_FIELDS = ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format"]


def test_no_field_value_breaks_the_server(served):
    """Every field with values of every JSON type: the answer is 200 or a 4xx error, never a 500."""
    http = httpx.Client(timeout=30)
    for api, base in (("completions", {"prompt": "a b"}), ("chat/completions", {"messages": [
            {"role": "user", "content": "a b"}]})):
        for name in FIELDS if api == "completions" else CHAT_FIELDS:
            for value in ODD_VALUES:
                body = {"model": served.name, "max_tokens": 1, **base, name: value}
                reply = http.post(f"{served.url}/v1/{api}", json=body)
                assert reply.status_code in (200, 400, 404), (api, name, value, reply.text)
                if reply.status_code != 200:
                    assert reply.json()["error"]["message"], (api, name, value)
    assert httpx.get(f"{served.url}/health").status_code == 200

# --- clients that leave, load ----------------------------------------------------------------


def slowed(monkeypatch) -> None:
    """Each round of the server's batch takes 10 ms longer, so a 400-token request runs for seconds."""
    from specdec.decode.batch import Batch

    step = Batch.step
    monkeypatch.setattr(Batch, "step", lambda self: time.sleep(0.01) or step(self))


@pytest.fixture
def slow_rounds(served, monkeypatch):
    slowed(monkeypatch)


def test_disconnect_mid_stream_stops_the_generation(served, slow_rounds):
    before = served.metrics()
    body = {"model": served.name, "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True, **NO_EOS}
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk read, then the connection closes
    deadline = time.monotonic() + 10
    while served.metrics().get(("specdec:requests_total", "cancelled"), 0) == before.get(
            ("specdec:requests_total", "cancelled"), 0):
        assert time.monotonic() < deadline, "the generation did not stop"
        time.sleep(0.05)
    generated = served.metrics()[("specdec:generation_tokens_total",)] - before[("specdec:generation_tokens_total",)]
    assert 0 < generated < 400
    reply = served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=5, extra_body=NO_EOS)
    assert reply.usage.completion_tokens == 5


def resident_mib() -> float:
    """This process's resident memory (the in-process server's, and the test's)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_soak_some_cancelled(served):
    """40 requests, 4 at a time, a quarter of them streams closed after the first chunk: every one
    is answered or cancelled, the server serves the next, the request counter counts them all, and
    memory stays flat from the first 20 to the next."""
    before = served.metrics()
    client = served.client(timeout=60)

    def one(i: int) -> str:
        if i % 4 == 3:
            stream = client.completions.create(model=served.name, prompt=PROMPT, max_tokens=60, stream=True,
                                               temperature=0)
            next(iter(stream))
            stream.close()
            return "left"
        if i % 2:
            reply = client.chat.completions.create(model=served.name, messages=[{"role": "user", "content": PROMPT}],
                                                   max_tokens=8 + i % 5, temperature=0.7, seed=i, extra_body=NO_EOS)
        else:
            reply = client.completions.create(model=served.name, prompt=PROMPT, max_tokens=8 + i % 5,
                                              extra_body=NO_EOS)
        assert reply.usage.completion_tokens == 8 + i % 5
        return "answered"

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(one, range(20)))
        warm = resident_mib()
        outcomes += list(pool.map(one, range(20, 40)))
    assert outcomes.count("answered") == 30
    assert resident_mib() - warm < 32, "resident memory grew over the second half of the soak"
    deadline = time.monotonic() + 10
    ended = lambda: sum(served.metrics().get(("specdec:requests_total", o), 0) - before.get(
        ("specdec:requests_total", o), 0) for o in ("stop", "length", "cancelled", "error"))
    while ended() < 40:
        assert time.monotonic() < deadline, f"{ended()} of 40 requests ended"
        time.sleep(0.05)
    assert served.metrics()[("specdec:requests_total", "error")] == before[("specdec:requests_total", "error")]
    assert httpx.get(f"{served.url}/health").status_code == 200



@pytest.mark.parametrize("round_rows", ["0", "16"])
def test_concurrent_requests_decode_together_each_as_alone(gguf, monkeypatch, round_rows):
    """Six greedy requests (different prompts and lengths, chat and completions) sent at once to
    a server that decodes up to 3 together, arriving prompts prefilled alone or in chunks inside
    the running rounds (--round-rows): each answer equals the same request sent alone, and the
    batch ran 3 sequences at once (it batched, within --max-sequences), never more."""
    from specdec.decode.batch import Batch

    running = start_native(gguf, "--max-sequences", "3", "--round-rows", round_rows)
    sizes: list[int] = []
    step = Batch.step
    monkeypatch.setattr(Batch, "step", lambda self: sizes.append(len(self.running)) or step(self))
    client = running.client(timeout=60)
    prompts = [" ".join(WORDS[i : i + 3 + i % 4]) for i in range(0, 30, 5)]

    def ask(i: int) -> str:
        if i % 2:
            return client.chat.completions.create(model=running.name, messages=[{"role": "user", "content": prompts[i]}],
                                                  max_tokens=10 + 3 * i, temperature=0).choices[0].message.content
        return client.completions.create(model=running.name, prompt=prompts[i], max_tokens=10 + 3 * i,
                                         temperature=0).choices[0].text

    try:
        alone = [ask(i) for i in range(6)]
        assert max(sizes) == 1
        sizes.clear()
        with ThreadPoolExecutor(6) as pool:
            together = list(pool.map(ask, range(6)))
    finally:
        stop(running)
    assert together == alone
    assert max(sizes) == 3


def test_a_request_waits_for_kv_room(gguf, monkeypatch):
    """With --kv-tokens room for about one request's reservation, two sent at once decode one
    after the other (the second waits in the batch's admission, not refused), both answered."""
    from specdec.decode.batch import Batch

    running = start_native(gguf, "--kv-tokens", "60")
    sizes: list[int] = []
    step = Batch.step
    monkeypatch.setattr(Batch, "step", lambda self: sizes.append(len(self.running)) or step(self))
    client = running.client(timeout=60)
    try:
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda i: client.completions.create(model=running.name, prompt=PROMPT,
                                                                        max_tokens=30, temperature=0,
                                                                        extra_body=NO_EOS), range(2)))
    finally:
        stop(running)
    assert [r.usage.completion_tokens for r in replies] == [30, 30]
    assert max(sizes) == 1


def test_shutdown_ends_a_running_stream(gguf, monkeypatch):
    """What SIGINT/SIGTERM do (uvicorn calls handle_exit) with --shutdown-timeout 0: the running
    generation ends at its next round with finish_reason "abort", the stream closes with [DONE]
    and the server exits (the graceful default: tests/test_serve_faults.py)."""
    import signal

    running = start_native(gguf, "--shutdown-timeout", "0")
    slowed(monkeypatch)
    body = {"model": running.name, "prompt": PROMPT, "max_tokens": 400, "stream": True, **NO_EOS}
    lines = []
    with httpx.stream("POST", f"{running.url}/v1/completions", json=body, timeout=30) as reply:
        for line in filter(None, reply.iter_lines()):
            lines.append(line)
            if len(lines) == 1:
                running.server.handle_exit(signal.SIGTERM, None)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "abort" and last["timings"]["predicted_n"] < 400
    running.worker.join(10)
    assert running.worker.state == "stopped"

# --- the worker's queue, the API key -----------------------------------------------------------


def test_full_queue_is_503_with_retry_after():
    import asyncio

    from specdec.serve.errors import ApiError
    from specdec.serve.job import Job
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.request import Defaults, Generation, Sampling
    from specdec.serve.worker import DecodeWorker

    worker = DecodeWorker(lambda: None, ServerMetrics("m"), "m", Defaults(), max_queue=2)
    worker.state = "ready"  # never started: jobs stay queued
    loop = asyncio.new_event_loop()
    job = lambda: Job(Generation("completions", (1,), 4, Sampling(0.0, None, None, None, None)), loop)
    worker.submit(job())
    worker.submit(job())
    with pytest.raises(ApiError) as full:
        worker.submit(job())
    assert full.value.status == 503 and int(full.value.headers["Retry-After"]) >= 1
    assert "2 requests are waiting" in full.value.message
    loop.close()



def test_loading_answers_503():
    from starlette.testclient import TestClient

    from specdec.serve.app import Settings, create_app
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.request import Defaults
    from specdec.serve.worker import DecodeWorker

    worker = DecodeWorker(lambda: None, ServerMetrics("m"), "m", Defaults(), max_queue=2)  # not started: loading
    client = TestClient(create_app(worker, Settings()))
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "loading" and "Retry-After" in health.headers
    assert client.get("/v1/models").status_code == 503
    reply = client.post("/v1/completions", json={"prompt": "a"})
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "loading"
    assert client.get("/metrics").status_code == 200

def test_api_key(gguf):
    running = start_native(gguf, "--api-key", "sesame")
    try:
        with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
            running.client(api_key="wrong").completions.create(model=running.name, prompt=PROMPT, max_tokens=2)
        assert httpx.post(f"{running.url}/v1/completions", json={"prompt": PROMPT}).status_code == 401
        assert httpx.get(f"{running.url}/metrics").status_code == 401
        assert httpx.get(f"{running.url}/health").status_code == 200  # open without the key
        reply = running.client(api_key="sesame").completions.create(model=running.name, prompt=PROMPT, max_tokens=3)
        assert reply.usage.completion_tokens == 3
        assert httpx.get(f"{running.url}/metrics", headers={"Authorization": "Bearer sesame"}).status_code == 200
    finally:
        stop(running)


def test_text_stream_holds_back_a_stop_string_across_tokens():
    from specdec.serve.text import TextStream

    class Chars:  # token i is the character chr(i)
        def decode(self, tokens, skip_special_tokens=True):
            return "".join(chr(t) for t in tokens)

    stream = TextStream(Chars(), stops=("END",))
    out = [stream.push(ord(c)) for c in "abEN"]
    assert out == ["a", "b", "", ""]  # "EN" may start END
    assert stream.push(ord("D")) == "" and stream.stopped
    stream = TextStream(Chars(), stops=("END",))
    assert "".join(stream.push(ord(c)) for c in "xENy") + stream.finish() == "xENy" and not stream.stopped


# --- the engine's hooks the server decodes with ------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "chain", "tree"])
def test_engine_hands_the_rows_that_judged_each_token(kind):
    """on_target_logits gives, for every committed token, the target's row that chose it: greedy,
    its argmax is the token (chain and tree verification alike); the output is unchanged."""
    from specdec import DraftModel, generate
    from specdec.proposers.tree import TreeDraft

    target = tiny_model(1)
    draft = perturbed(tiny_model(1), seed=2, scale=0.3)
    prompt = list(range(1, 12))
    plain = generate(target, prompt, max_new_tokens=30, eos_token_id=[]).new_tokens
    drafter = {"plain": None, "chain": DraftModel(draft, 3), "tree": TreeDraft(DraftModel(draft, 3), width=2)}[kind]
    rows, committed = [], []
    result = generate(target, prompt, drafter=drafter, max_new_tokens=30, eos_token_id=[],
                      on_target_logits=rows.append, on_commit=lambda tokens, _: committed.append(tokens))
    assert result.new_tokens == plain
    assert [r.shape[0] for r in rows] == [len(c) for c in committed]
    assert torch.cat(rows).argmax(-1).tolist() == plain
    if kind != "plain":
        assert result.stats.accepted > 0


def test_engine_stops_when_on_commit_asks():
    from specdec import DraftModel, generate

    target = tiny_model(1)
    calls = []
    result = generate(target, list(range(1, 12)), drafter=DraftModel(perturbed(tiny_model(1), 2, 0.3), 3),
                      max_new_tokens=30, eos_token_id=[], on_commit=lambda tokens, _: calls.append(tokens) or
                      len(calls) == 3)
    assert result.finish_reason == "stopped" and len(calls) == 3
    assert result.new_tokens == [t for c in calls for t in c] and result.stats.rounds == 2
