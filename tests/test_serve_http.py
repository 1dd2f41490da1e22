"""What a client sends that the HTTP side of `specdec serve` must refuse or survive (issue 51):
every bounded field at and past its bound, numbers no float or int64 holds, JSON nested past the
parser's recursion, text no tokenizer encodes, a body that is not application/json, a web page's
Origin or a rebinding Host; a fault inside the server answered as a 500 with an id and no
exception text; and a vanishing temperature decoded as greedy.

The field checks run on serve.request directly (fast); the statuses run through a native server
of the tiny GGUF pair (tests/serve_native.py) that allows one web origin, GOOD."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from gguf_files import VOCAB
from serve_native import CONTEXT, start_native, stop

from specdec.serve.errors import ApiError
from specdec.serve.request import (
    CHAT,
    COMPLETIONS,
    GREEDY_BELOW,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TEMPERATURE,
    Model,
    read_request,
)

GOOD = "http://good.example:3000"
PROMPT = "a b c d e a b c"
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' server on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = start_native(tmp_path_factory, "--allowed-origins", f"{GOOD}, http://other.example")
    yield running
    stop(running)


# --- the fields, at and past their bounds (serve.request) --------------------------------------

MODEL = Model("m", vocab_size=VOCAB, context=CONTEXT)


def read(api: str = COMPLETIONS, **fields):
    base = {"prompt": "a b"} if api == COMPLETIONS else {"messages": [{"role": "user", "content": "a b"}]}
    return read_request({**base, **fields}, api, MODEL, lambda text: [1, 2, 3],
                        lambda messages, tools: ([1, 2, 3], None))


# (field, a value at the bound: taken, a value past it: a 400 naming the field)
BOUNDS = [
    ("seed", INT64_MAX, INT64_MAX + 1),
    ("seed", INT64_MIN, INT64_MIN - 1),
    ("temperature", MAX_TEMPERATURE, MAX_TEMPERATURE * 1.000001),
    ("temperature", 0, -1e-300),
    ("temperature", 0.5, 10**400),  # an integer of 401 digits: no float holds it
    ("top_p", 1, 1.0000001),
    ("top_p", 1e-300, 0),
    ("min_p", 0.999999, 1),
    ("min_p", 0, -1e-9),
    ("top_k", INT64_MAX, INT64_MAX + 1),
    ("top_k", 1, -2),
    ("max_tokens", CONTEXT - 3, CONTEXT - 2),  # the prompt holds 3 tokens
    ("max_tokens", 1, 0),
    ("max_tokens", 1, 10**30),
    ("logprobs", MAX_LOGPROBS, MAX_LOGPROBS + 1),
    ("stop", ["x"] * MAX_STOPS, ["x"] * (MAX_STOPS + 1)),
    ("stop", "x" * MAX_STOP_CHARS, "x" * (MAX_STOP_CHARS + 1)),
]


@pytest.mark.parametrize("name,taken,refused", BOUNDS, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BOUNDS)])
def test_a_field_at_its_bound_is_taken_and_past_it_refused(name, taken, refused):
    read(**{name: taken})
    with pytest.raises(ApiError) as error:
        read(**{name: refused})
    assert error.value.status == 400 and error.value.param == name, error.value.message
    assert len(error.value.message) < 300  # a number of hundreds of digits is not echoed whole


def test_chat_bounds():
    read(CHAT, logprobs=True, top_logprobs=MAX_LOGPROBS)
    with pytest.raises(ApiError, match="top_logprobs must be between"):
        read(CHAT, logprobs=True, top_logprobs=MAX_LOGPROBS + 1)
    read(CHAT, max_completion_tokens=CONTEXT - 3)
    with pytest.raises(ApiError, match="lower max_completion_tokens"):
        read(CHAT, max_completion_tokens=CONTEXT - 2)


def test_the_values_a_field_takes():
    g = read(top_k=VOCAB, top_p=1, min_p=0, seed=INT64_MIN)
    assert g.sampling.top_k is None and g.sampling.top_p is None and g.sampling.min_p is None  # all off
    assert g.sampling.seed == INT64_MIN
    assert read(top_k=VOCAB - 1).sampling.top_k == VOCAB - 1
    assert read(max_tokens=5.0).max_tokens == 5  # JSON has one number type


def test_a_temperature_below_the_floor_is_greedy():
    assert GREEDY_BELOW == 1e-5
    for tiny in (1e-300, 5e-324, 9.99e-6):
        assert read(temperature=tiny, top_k=5).sampling.temperature == 0.0
    assert read(temperature=GREEDY_BELOW).sampling.temperature == GREEDY_BELOW


@pytest.mark.parametrize("where,body", [
    ("prompt", {"prompt": "a \ud800 b"}),
    ("messages[0].content", {"messages": [{"role": "user", "content": "a \udfff"}]}),
    ("messages[1].content[0].text", {"messages": [{"role": "user", "content": "a"}, {
        "role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]}),
    ("stop[1]", {"prompt": "a", "stop": ["x", "\ud800"]}),
    ("model", {"prompt": "a", "model": "\udc00"}),
])
def test_text_that_is_not_unicode_is_refused_naming_the_field(where, body):
    api = CHAT if "messages" in body else COMPLETIONS
    with pytest.raises(ApiError, match="not valid Unicode") as error:
        read_request(body, api, MODEL, lambda t: t.encode("utf-8"), lambda m, tools: pytest.fail("encoded"))
    assert error.value.status == 400 and error.value.param == where


# --- through the server: statuses and bodies ---------------------------------------------------


def post(served, body: bytes | dict, path: str = "completions", **headers) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps({"model": served.name, **body}).encode()
    return httpx.post(f"{served.url}/v1/{path}", content=content, headers={**JSON, **headers}, timeout=60)


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text[:300]
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("text,param", [
    ('"temperature": 1e400', "temperature"),  # json reads it as inf
    ('"temperature": ' + "9" * 400, "temperature"),  # an int no float holds
    ('"top_p": 0.' + "3" * 500 + "e1", "top_p"),  # hundreds of digits: 3.33...
    ('"seed": ' + str(2**63), "seed"),
    ('"top_k": -' + "1" * 300, "top_k"),
    ('"max_tokens": ' + "1" * 300, "max_tokens"),
    ('"prompt": "\\ud800"', "prompt"),  # a lone surrogate, as JSON spells it
    ('"messages": [{"role": "user", "content": "\\udfff"}]', "messages[0].content"),
])
def test_numbers_and_text_past_any_bound_are_400s(served, text, param):
    path = "chat/completions" if "messages" in text else "completions"
    body = '{"prompt": "a b", "max_tokens": 2, ' + text + "}" if path == "completions" else "{" + text + "}"
    assert error_of(post(served, body.encode(), path), 400)["param"] == param


def test_a_float_of_hundreds_of_digits_in_range_is_taken(served):
    reply = post(served, b'{"prompt": "a b", "max_tokens": 2, "top_p": 0.' + b"9" * 500 + b', "temperature": 0.5}')
    assert reply.status_code == 200, reply.text


def test_nesting_is_bounded_before_parsing(served):
    from specdec.serve.body import MAX_DEPTH

    def nested(depth: int) -> bytes:  # an ignored field ("user") holding `depth` - 1 lists
        return b'{"prompt": "a b", "max_tokens": 1, "user": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    assert post(served, nested(MAX_DEPTH)).status_code == 200
    assert "nests arrays and objects" in error_of(post(served, nested(MAX_DEPTH + 1)), 400)["message"]
    assert error_of(post(served, b"[" * 100_000), 400)["code"] == "invalid_json"  # past Python's recursion limit
    assert error_of(post(served, b'{"a": ' * 50_000), 400)["code"] == "invalid_json"
    # brackets inside strings are text, not nesting
    assert post(served, {"prompt": "[" * 500 + "{ a", "max_tokens": 1}).status_code == 200


def test_only_json_bodies(served):
    body = json.dumps({"model": served.name, "prompt": PROMPT, "max_tokens": 2}).encode()
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        headers = {"Content-Type": media} if media else {}
        reply = httpx.post(f"{served.url}/v1/completions", content=body, headers=headers)
        error = error_of(reply, 415)
        assert "Content-Type: application/json" in error["message"] and error["code"] == "unsupported_media_type"
    for media in ("application/json; charset=utf-8", "Application/JSON"):
        assert httpx.post(f"{served.url}/v1/completions", content=body,
                          headers={"Content-Type": media}).status_code == 200


def test_a_foreign_origin_is_refused(served):
    before = served.metrics().get(("specdec:requests_rejected_total", "forbidden"), 0)
    for origin in ("http://evil.example", "http://good.example:3001", "null", "http://127.0.0.1:8000"):
        reply = post(served, {"prompt": PROMPT, "max_tokens": 2}, Origin=origin)
        error = error_of(reply, 403)
        assert error["code"] == "origin_not_allowed" and "--allowed-origins" in error["message"]
        assert "access-control-allow-origin" not in reply.headers
    assert httpx.get(f"{served.url}/v1/models", headers={"Origin": "http://evil.example"}).status_code == 403
    preflight = httpx.options(f"{served.url}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403
    assert served.metrics()[("specdec:requests_rejected_total", "forbidden")] == before + 6


def test_an_allowed_origin_gets_cors(served):
    reply = post(served, {"prompt": PROMPT, "max_tokens": 2}, Origin=GOOD)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == GOOD
    assert httpx.get(f"{served.url}/v1/models", headers={"Origin": "http://other.example"}).headers[
        "access-control-allow-origin"] == "http://other.example"
    preflight = httpx.options(f"{served.url}/v1/chat/completions", headers={
        "Origin": GOOD, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == GOOD
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"].lower()


def test_a_rebinding_host_is_refused(served):
    port = served.url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "192.168.1.10"):
        error = error_of(post(served, {"prompt": PROMPT, "max_tokens": 2}, Host=host), 403)
        assert error["code"] == "host_not_allowed" and "--allowed-hosts" in error["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST.", f"[::1]:{port}", "app.localhost"):
        assert post(served, {"prompt": PROMPT, "max_tokens": 2}, Host=host).status_code == 200, host


def test_the_openai_client_still_works(served):
    """The official client sends JSON and no Origin: nothing here gets in its way."""
    reply = served.client().chat.completions.create(model=served.name, messages=[{"role": "user", "content": PROMPT}],
                                                    max_tokens=3, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 3


def test_a_fault_is_a_500_with_an_id_the_log_carries(served, monkeypatch, capfd):
    import specdec.serve.app as app

    def broken(*args):
        raise RuntimeError("secret detail /home/user/model")

    monkeypatch.setattr(app, "read_request", broken)
    error = error_of(post(served, {"prompt": PROMPT, "max_tokens": 2}), 500)
    found = re.fullmatch(r"internal error (err-[0-9a-f]{12}): .*", error["message"])
    assert found and "secret" not in json.dumps(error) and "RuntimeError" not in json.dumps(error)
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    log = capfd.readouterr().err
    line = next(line for line in log.splitlines() if found.group(1) in line)
    assert line.startswith("[specdec] internal error err-")
    assert "RuntimeError: secret detail /home/user/model" in log.split(line, 1)[1]  # the traceback follows
    monkeypatch.undo()
    assert post(served, {"prompt": PROMPT, "max_tokens": 2}).status_code == 200  # the server goes on


def test_internal_errors_have_distinct_ids(capsys):
    from specdec.serve.errors import internal

    ids = {internal(ValueError("x")).message.split()[2].rstrip(":") for _ in range(20)}
    assert len(ids) == 20 and all(re.fullmatch(r"err-[0-9a-f]{12}", i) for i in ids)
    assert capsys.readouterr().err.count("ValueError: x") == 20


def test_a_vanishing_temperature_decodes_as_greedy(served):
    """T = 1e-300 (and any T below 1e-5) answers what T = 0 answers; without the floor, logits /
    1e-300 overflow float32 and the draw returns garbage."""
    body = {"prompt": PROMPT, "max_tokens": 16, "ignore_eos": True, "seed": 3, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    tokens = lambda t: post(served, {**body, "temperature": t}).json()["choices"][0]["logprobs"]["tokens"]
    greedy = tokens(0)
    assert tokens(1e-300) == greedy and tokens(9e-6) == greedy
    assert len(greedy) == 16


# --- the Origin and Host rules (serve.security), without a model --------------------------------


def test_which_hosts_a_server_answers():
    from specdec.serve.security import Sites

    loopback = Sites(bound="127.0.0.1")
    assert all(loopback.host_allowed(h) for h in ("localhost", "LocalHost:8080", "127.0.0.1:1", "127.9.9.9",
                                                  "[::1]:8080", "a.localhost", "localhost."))
    assert not any(loopback.host_allowed(h) for h in ("evil.example", "localhost.evil.example", "10.0.0.1", "[::2]"))
    assert Sites(bound="::1").host_allowed("[::1]") and not Sites(bound="::1").host_allowed("evil.example")
    assert Sites(bound="0.0.0.0").host_allowed("evil.example")  # beyond loopback, no check unless asked
    listed = Sites(hosts=("api.example",), bound="0.0.0.0")
    assert listed.host_allowed("API.example:8080") and listed.host_allowed("0.0.0.0:8080")
    assert listed.host_allowed("localhost") and not listed.host_allowed("evil.example")
    assert Sites(hosts=("*",), bound="127.0.0.1").host_allowed("evil.example")


def test_the_flags_read_into_sites():
    from specdec.cli import build_parser
    from specdec.cli.serve import sites_of
    from specdec.errors import SpecdecError
    from specdec.serve.security import Sites

    parse = lambda *flags: sites_of(build_parser().parse_args(["serve", *flags]))
    assert parse() == Sites((), None, "127.0.0.1")
    assert parse("--allowed-origins", "http://A.example:3000/, null,", "--allowed-hosts", "b.example:80, *",
                 "--host", "0.0.0.0") == Sites(("http://a.example:3000", "null"), ("b.example", "*"), "0.0.0.0")
    for bad in ("a.example", "http://a.example/path", "localhost:3000"):
        with pytest.raises(SpecdecError, match="--allowed-origins takes origins such as"):
            parse("--allowed-origins", bad)


def test_the_guard_runs_before_the_routes_and_the_api_key():
    """Starlette's test client names its Host "testserver": a loopback server refuses it unless
    listed; an allowed origin's preflight is answered without the API key; with "*" every origin
    gets CORS headers."""
    from starlette.testclient import TestClient

    from specdec.serve.app import Settings, create_app
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.request import Defaults
    from specdec.serve.security import Sites
    from specdec.serve.worker import DecodeWorker

    worker = DecodeWorker(lambda: None, ServerMetrics("m"), "m", Defaults(), max_queue=2)  # not started
    client = lambda sites, key=None: TestClient(create_app(worker, Settings(api_key=key, sites=sites)))
    refused = client(Sites(bound="127.0.0.1")).get("/metrics")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"
    assert client(Sites(hosts=("testserver",), bound="127.0.0.1")).get("/metrics").status_code == 200
    keyed = client(Sites(origins=(GOOD,)), key="sesame")
    preflight = keyed.options("/v1/completions", headers={"Origin": GOOD, "Access-Control-Request-Method": "POST",
                                                          "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == GOOD
    unauthorized = keyed.get("/metrics", headers={"Origin": GOOD})
    assert unauthorized.status_code == 401 and unauthorized.headers["access-control-allow-origin"] == GOOD
    anyone = client(Sites(origins=("*",))).get("/metrics", headers={"Origin": "http://any.example"})
    assert anyone.status_code == 200 and anyone.headers["access-control-allow-origin"] == "*"
