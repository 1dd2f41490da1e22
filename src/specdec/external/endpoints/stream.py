"""One streamed completion from an OpenAI-compatible endpoint, timed chunk by chunk.

The request asks for greedy decoding (temperature 0) unless it carries sampling fields
(`sampling_fields`: temperature, top_p, top_k, min_p, seed, the names vLLM, llama-server and
specdec serve share), a stream of server-sent events, and
logprobs: they carry each token's id (llama.cpp puts an `id` in each entry; vLLM spells tokens
`token_id:N` when asked with `return_tokens_as_token_ids`) and the top alternatives with their
log-probabilities, which give the gap between the two best tokens where outputs differ. A
server that gives no ids still yields the text. Fields a server does not know are ignored by
vLLM and llama.cpp alike (`cache_prompt: false` makes llama.cpp prefill every request afresh,
so time to first token means the same for every row).

Timing: `sent` is taken before the request goes out; each chunk that carries tokens is stamped
on arrival. Time to first token is the first stamp; decode time runs from it to the last, over
the tokens after the first chunk (the engine's definition of decode tokens/s).

Two clients send the same request and read the same chunks: httpx, reading the event stream
itself (`complete`, the default), or the official `openai` package (`complete_openai`: its
`completions.create` / `chat.completions.create` with `stream=True`, the fields OpenAI's API
lacks in `extra_body`), whose chunks are parsed into its typed objects before they are stamped,
as an application using that client sees them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from ...errors import SpecdecError
from .logprobs import Top, token_entries
from .spec import CHAT, IDS, TEXT, Endpoint, describe

FINISH = {"stop": "eos", "length": "length"}  # OpenAI's finish reasons as specdec's rows spell them


@dataclass(frozen=True)
class Request:
    max_tokens: int
    prompt_ids: list[int] | None = None  # /v1/completions
    prompt_text: str | None = None  # the same prompt as text, for a completions server that takes no ids
    message: str | None = None  # /v1/chat/completions: one user message
    messages: list[dict] | None = None  # ... or a whole conversation ({"role", "content"}), sent instead
    top_logprobs: int = 1  # alternatives per position; 0: no logprobs (text only)
    sampling: dict | None = None  # sampling_fields(); None: greedy
    cache_prompt: bool = False  # llama-server: True lets it reuse its slot's cached prefix (a conversation)


def sampling_fields(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None,
                    seed: int | None) -> dict | None:
    """A sampled request's fields (None for greedy: temperature 0 and top_p 1 are sent); the
    filters that are off are left out, so each server applies its own 'off', not a default."""
    if temperature == 0:
        return None
    given = {"top_k": top_k, "top_p": top_p, "min_p": min_p or None, "seed": seed}
    return {"temperature": temperature, **{k: v for k, v in given.items() if v is not None}}


@dataclass
class Streamed:
    text: str = ""
    token_ids: list[int | None] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # each named token's text, beside token_ids
    top: list[Top] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)  # seconds after sending, per chunk with tokens
    chunk_texts: list[str] = field(default_factory=list)  # the text of each of those chunks
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    unnamed_chunks: int = 0  # chunks with tokens but no logprobs (llama.cpp's speculated tokens)
    finish_reason: str | None = None
    timings: dict | None = None  # llama.cpp's
    usage_tokens: int | None = None
    prompt_tokens: int | None = None  # usage's
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, else llama.cpp's timings.cache_n
    sent: float = 0.0  # time.perf_counter() when the request went out (a wave's requests are placed by it)

    @property
    def ids(self) -> list[int] | None:
        """The output as token ids, where the server named every token's id."""
        known = self.token_ids and not self.unnamed_chunks and all(t is not None for t in self.token_ids)
        return list(self.token_ids) if known else None  # type: ignore[arg-type]

    @property
    def n_tokens(self) -> int:
        """From the ids where every token came with one (llama.cpp sends logprobs only for tokens it
        did not speculate), else the server's count, else one token per chunk."""
        if self.ids is not None:
            return len(self.token_ids)
        counted = self.usage_tokens if self.usage_tokens is not None else (self.timings or {}).get("predicted_n")
        return int(counted) if counted is not None else sum(self.chunk_tokens)

    @property
    def token_texts(self) -> list[str] | None:
        """Each token's text: from logprobs where every token was named, else the chunks' texts
        where each chunk was one token (llama.cpp streams one per chunk, speculated or not, and
        counts them in `timings`/`usage`); None where tokens cannot be told apart."""
        if self.ids is not None:
            return list(self.pieces)
        counted = self.usage_tokens if self.usage_tokens is not None else (self.timings or {}).get("predicted_n")
        return list(self.chunk_texts) if counted == len(self.chunk_texts) else None

    @property
    def ttft_s(self) -> float | None:
        return self.stamps[0] if self.stamps else None

    @property
    def decode_s(self) -> float:
        return self.stamps[-1] - self.stamps[0] if self.stamps else 0.0

    @property
    def decode_tokens(self) -> int:
        return max(self.n_tokens - (self.chunk_tokens[0] if self.chunk_tokens else 0), 0)


def body(request: Request, api: str, model: str, form: str = IDS) -> dict:
    """The request's JSON; `form` (the probe's Served.prompt_form) says whether a completions
    prompt goes as ids or as text."""
    sampling = request.sampling or {"temperature": 0.0, "top_p": 1.0}
    common = {"model": model, "max_tokens": request.max_tokens, **sampling, "stream": True,
              "stream_options": {"include_usage": True}, "cache_prompt": request.cache_prompt,
              "return_tokens_as_token_ids": True}
    if api == CHAT:
        logprobs = {"logprobs": True, "top_logprobs": request.top_logprobs} if request.top_logprobs else {}
        messages = request.messages or [{"role": "user", "content": request.message}]
        return {**common, "messages": messages, **logprobs}
    return {**common, "prompt": request.prompt_text if form == TEXT else request.prompt_ids,
            **({"logprobs": request.top_logprobs} if request.top_logprobs else {})}


def complete(client: httpx.Client, endpoint: Endpoint, model: str, request: Request, form: str = IDS) -> Streamed:
    """Send one request and read its stream to the end; any failure is a one-line SpecdecError
    naming the endpoint."""
    if form == TEXT and request.prompt_text is None:
        raise SpecdecError(f"endpoint {endpoint.name} takes no token ids and this prompt has no text form")
    out = Streamed()
    out.sent = sent = time.perf_counter()
    try:
        with client.stream("POST", endpoint.url, json=body(request, endpoint.api, model, form)) as reply:
            _check_reply(reply, endpoint)
            done = False
            for line in reply.iter_lines():
                chunk = _event(line, endpoint)
                if chunk is _DONE:
                    done = True
                    break
                if chunk is not None:
                    _take(chunk, out, time.perf_counter() - sent, endpoint)
    except httpx.HTTPError as e:
        raise SpecdecError(f"endpoint {endpoint.name}: {describe(e, endpoint.url)}") from None
    if not done and out.finish_reason is None:
        raise SpecdecError(f"endpoint {endpoint.name}: the stream from {endpoint.url} ended before the completion "
                           f"finished (after {out.n_tokens} tokens): the server stopped mid-reply")
    if not out.stamps:
        raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} streamed no tokens")
    return out


# The request fields OpenAI's own API does not define: sent by the openai client in `extra_body`.
_EXTRA_FIELDS = ("cache_prompt", "return_tokens_as_token_ids", "top_k", "min_p")


def openai_client(endpoint: Endpoint, timeout_s: float):
    """The official client for `endpoint`'s server: no retries (a retried request would be timed
    as one), `timeout_s` to connect and between two chunks, a key nobody checks (the servers
    measured here run without one)."""
    try:
        import openai
    except ImportError:
        raise SpecdecError("--client openai needs the openai package: pip install openai") from None
    return openai.OpenAI(base_url=f"{endpoint.server}/v1", api_key="none", max_retries=0, timeout=timeout_s)


def complete_openai(client, endpoint: Endpoint, model: str, request: Request, form: str = IDS) -> Streamed:
    """`complete` through the official openai client (`openai_client`): the same request body and
    the same chunks, each stamped once the client has parsed it; its errors as one-line
    SpecdecErrors naming the endpoint."""
    import openai

    if form == TEXT and request.prompt_text is None:
        raise SpecdecError(f"endpoint {endpoint.name} takes no token ids and this prompt has no text form")
    fields = body(request, endpoint.api, model, form)
    extra = {k: fields.pop(k) for k in _EXTRA_FIELDS if k in fields}
    create = client.chat.completions.create if endpoint.api == CHAT else client.completions.create
    out = Streamed()
    out.sent = sent = time.perf_counter()
    try:
        stream = create(**fields, extra_body=extra)
        with stream:
            for chunk in stream:
                _take(chunk.to_dict(), out, time.perf_counter() - sent, endpoint)
    except openai.APIStatusError as e:
        raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} answered HTTP {e.status_code}: "
                           f"{_short(e.response.text if e.response is not None else str(e))}") from None
    except openai.APITimeoutError:
        raise SpecdecError(f"endpoint {endpoint.name}: no reply from {endpoint.url} in time: check the server or "
                           "raise --endpoint-timeout") from None
    except openai.APIConnectionError as e:  # the transport's error is its cause
        raise SpecdecError(f"endpoint {endpoint.name}: {describe(e.__cause__ or e, endpoint.url)}") from None
    except openai.APIError as e:  # an error event mid-stream
        raise SpecdecError(f"endpoint {endpoint.name}: the server reported an error mid-stream: "
                           f"{_short(str(e.message))}") from None
    except Exception as e:  # the transport's own error while the stream is read (the client does not wrap it)
        if type(e).__module__.split(".")[0] not in ("httpx", "httpx2"):
            raise
        raise SpecdecError(f"endpoint {endpoint.name}: {describe(e, endpoint.url)}") from None
    if out.finish_reason is None:
        raise SpecdecError(f"endpoint {endpoint.name}: the stream from {endpoint.url} ended before the completion "
                           f"finished (after {out.n_tokens} tokens): the server stopped mid-reply")
    if not out.stamps:
        raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} streamed no tokens")
    return out


def _check_reply(reply: httpx.Response, endpoint: Endpoint) -> None:
    if reply.status_code != 200:
        reply.read()
        raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} answered HTTP {reply.status_code}: "
                           f"{_short(reply.text)}")
    kind = reply.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        reply.read()
        raise SpecdecError(f"endpoint {endpoint.name}: {endpoint.url} did not stream server-sent events "
                           f"(Content-Type {kind or 'none'}): not an OpenAI-compatible reply: {_short(reply.text)}")


_DONE = object()


def _event(line: str, endpoint: Endpoint) -> dict | object | None:
    """One line of the event stream: a JSON chunk, _DONE, or None (comments, blank lines, other fields)."""
    field_name, _, value = line.partition(":")
    value = value.strip()
    if field_name not in ("data", "error"):
        return None
    if value == "[DONE]":
        return _DONE
    try:
        chunk = json.loads(value)
    except ValueError:
        raise SpecdecError(f"endpoint {endpoint.name}: a stream line is not JSON ({_short(line)}): "
                           "not an OpenAI-compatible reply") from None
    if field_name == "error" or (isinstance(chunk, dict) and "error" in chunk):
        error = chunk.get("error", chunk) if isinstance(chunk, dict) else chunk
        message = error.get("message", error) if isinstance(error, dict) else error
        raise SpecdecError(f"endpoint {endpoint.name}: the server reported an error mid-stream: {_short(str(message))}")
    if not isinstance(chunk, dict):
        raise SpecdecError(f"endpoint {endpoint.name}: a stream chunk is not a JSON object: {_short(value)}")
    return chunk


def _take(chunk: dict, out: Streamed, at: float, endpoint: Endpoint) -> None:
    """Fold one chunk into the result: text, tokens (with their stamp), finish reason, counts."""
    if chunk.get("timings"):
        out.timings = chunk["timings"]
        if out.cached_tokens is None and "cache_n" in out.timings:
            out.cached_tokens = out.timings["cache_n"]
    if isinstance(chunk.get("usage"), dict):
        usage = chunk["usage"]
        out.usage_tokens, out.prompt_tokens = usage.get("completion_tokens"), usage.get("prompt_tokens")
        if (cached := (usage.get("prompt_tokens_details") or {}).get("cached_tokens")) is not None:
            out.cached_tokens = cached
    choices = chunk.get("choices")
    if choices is None:
        if "usage" in chunk or "timings" in chunk:
            return
        raise SpecdecError(f"endpoint {endpoint.name}: a stream chunk has no choices: {_short(json.dumps(chunk))}")
    if not choices:
        return  # the usage chunk of OpenAI's stream_options has an empty list
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if endpoint.api == CHAT else choice.get("text")
    entries = token_entries(choice.get("logprobs"))
    if text or entries:
        out.text += text or ""
        out.chunk_texts.append(text or "")
        out.stamps.append(at)
        out.chunk_tokens.append(len(entries) if entries else 1)
        out.unnamed_chunks += not entries
        for token_id, piece, top in entries:
            out.token_ids.append(token_id)
            out.pieces.append(piece)
            out.top.append(top)
    if choice.get("finish_reason"):
        out.finish_reason = FINISH.get(choice["finish_reason"], choice["finish_reason"])


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "...")
