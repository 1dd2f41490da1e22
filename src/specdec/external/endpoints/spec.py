"""`NAME=URL` -> Endpoint, and the probe run once before any measurement.

The URL names the API: `.../v1/completions` or `.../v1/chat/completions`; a bare server address
(`http://host:port`, or one ending in `/v1`) means `/v1/completions`, which takes the prompt as
token ids, so every endpoint and specdec's own methods see the same prompt."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from ...errors import SpecdecError
from ...methods.spec import OPTIONS

COMPLETIONS = "completions"
CHAT = "chat"
_PATHS = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}
PROBE_TIMEOUT_S = 10.0
PROBE_TOKEN, PROBE_TEXT = 11, "Hello"  # a small id, in every vocabulary; a word


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str  # the completions URL requests go to
    api: str  # COMPLETIONS or CHAT

    @property
    def server(self) -> str:
        """scheme://host:port, where /v1/models and /metrics live."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


def parse_endpoint(text: str) -> Endpoint:
    """`NAME=URL`, checked: a name the method grammar can carry, an http(s) URL, a known API path."""
    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise SpecdecError(f"--endpoint takes NAME=URL, e.g. spec=http://127.0.0.1:8080/v1/completions; got {text!r}")
    read_name, _ = OPTIONS["name"]  # the method grammar carries it as endpoint:name=NAME
    try:
        read_name(name)
    except ValueError as e:
        raise SpecdecError(f"endpoint name {name!r} {e}") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecdecError(f"endpoint {name}: {url!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if path in ("", "/v1"):
        path = "/v1/completions"
    if path not in _PATHS:
        raise SpecdecError(f"endpoint {name}: {url} is neither /v1/completions nor /v1/chat/completions")
    return Endpoint(name, f"{parts.scheme}://{parts.netloc}{path}", _PATHS[path])


def parse_endpoints(texts: list[str]) -> list[Endpoint]:
    endpoints = [parse_endpoint(t) for t in texts]
    names = [e.name for e in endpoints]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise SpecdecError(f"two endpoints are called {twice}: give each --endpoint its own name")
    return endpoints


IDS, TEXT, MESSAGE = "ids", "text", "message"  # how the prompt is sent (Served.prompt_form)


@dataclass(frozen=True)
class Served:
    """What the probe found: the model id requests name, whether /metrics has vLLM's
    speculative-decoding counters (then they are read around each request), and the prompt's
    form: token ids, the same prompt as text (chat template applied: for a completions server
    that refuses ids, such as llama-cpp-python's), or a chat message."""

    model: str
    vllm_metrics: bool
    prompt_form: str = IDS


def probe(endpoint: Endpoint, client: httpx.Client) -> Served:
    """GET /v1/models (an OpenAI-compatible server lists what it serves) and /metrics, with
    one-line errors for a server that is down or answers something else."""
    from .metrics import has_spec_counters

    url = f"{endpoint.server}/v1/models"
    reply = get(client, endpoint, url)
    try:
        models = reply.json()["data"]
        model = str(models[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise SpecdecError(f"endpoint {endpoint.name}: {url} did not answer as an OpenAI-compatible server "
                           f"(no model list): {reply.text[:80]!r}") from None
    try:
        metrics = client.get(f"{endpoint.server}/metrics", timeout=PROBE_TIMEOUT_S)
        vllm = metrics.status_code == 200 and has_spec_counters(metrics.text)
    except httpx.HTTPError:
        vllm = False  # /metrics is optional (llama-server serves it only with --metrics)
    form = MESSAGE if endpoint.api == CHAT else IDS if takes_ids(endpoint, client, model) else TEXT
    return Served(model, vllm, form)


def takes_ids(endpoint: Endpoint, client: httpx.Client, model: str) -> bool:
    """Whether the completions endpoint takes a prompt of token ids: a one-token completion, not
    streamed (within the client's timeout: a server's first completion can be slow), with ids,
    and where that is refused the same with text. Servers refuse ids in their own ways
    (llama-cpp-python's answers 500 with its request type's validation error), so a refusal
    counts as "text only" when the text request succeeds, and is an error when it fails too."""
    refused = _one_token(endpoint, client, model, [PROBE_TOKEN])
    if refused is None:
        return True
    if _one_token(endpoint, client, model, PROBE_TEXT) is None:
        return False
    raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} refused a one-token completion: {refused}")


def _one_token(endpoint: Endpoint, client: httpx.Client, model: str, prompt: list[int] | str) -> str | None:
    """None if the server completes `prompt` by one token, else what it answered."""
    request = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": False}
    try:
        reply = client.post(endpoint.url, json=request)
    except httpx.HTTPError as e:
        raise SpecdecError(f"endpoint {endpoint.name}: {describe(e, endpoint.url)}") from None
    return None if reply.status_code == 200 else f"HTTP {reply.status_code}: {reply.text[:80]!r}"


def get(client: httpx.Client, endpoint: Endpoint, url: str) -> httpx.Response:
    """A GET with the endpoint's name in every error."""
    try:
        reply = client.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise SpecdecError(f"endpoint {endpoint.name}: {describe(e, url)}") from None
    if reply.status_code != 200:
        raise SpecdecError(f"endpoint {endpoint.name}: {url} answered HTTP {reply.status_code}: {reply.text[:80]!r}")
    return reply


def describe(error: BaseException, url: str) -> str:
    """What went wrong with a request, and what to do, in a few words. `error` is httpx's, or
    the same kind from the httpx fork the openai client runs on (told apart by class name)."""
    if _is(error, "ConnectError") and _refused(error):
        # The usual cause: the server was not started, or is still loading (vLLM opens its port
        # only once the model is loaded: minutes on a CPU).
        return (f"nothing is listening at {url} ({error}): start the server first and wait until it answers "
                "(vLLM: the command `specdec advise --export vllm` prints, after bash scripts/setup_vllm.sh; or "
                "scripts/serving_bench.py, which starts vLLM or llama-server and runs the bench: docs/serving.md)")
    if _is(error, "ConnectError"):
        return f"cannot connect to {url} ({error}): check the host and port"
    if _is(error, "TimeoutException"):
        return f"no reply from {url} in time ({type(error).__name__}): check the server or raise --endpoint-timeout"
    if _is(error, "RemoteProtocolError"):
        return f"the server at {url} closed the connection mid-reply ({error})"
    return f"request to {url} failed: {error}"


def _is(error: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(error).__mro__)


def _refused(error: BaseException) -> bool:
    """Whether the connection was refused (no process listens on the port), as opposed to a host
    that does not resolve or answer: httpx keeps the socket's error among the causes."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ConnectionRefusedError):
        cause = cause.__cause__ or cause.__context__
    return cause is not None
