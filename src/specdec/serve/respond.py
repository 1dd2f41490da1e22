"""The OpenAI response objects: whole replies, stream chunks, logprobs in both APIs' layouts,
`usage`, and `timings`: llama-server's names where it has them (prompt_n, prompt_ms,
predicted_n, predicted_ms, predicted_per_second, draft_n, draft_n_accepted), so tools that read
llama-server read specdec, and specdec's speculation figures beside them (rounds,
mean_accepted_length, acceptance per position, time per phase)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .request import CHAT, Generation
from .tool_reply import ToolReply

if TYPE_CHECKING:  # torch loads where the worker decodes
    from ..decode.stats import GenerationStats

# "abort": the client went away or the server is stopping (vLLM's word for it)
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "abort"}


@dataclass(frozen=True)
class TokenLogprob:
    """One returned token: its id, its own text, the target's log-probability of it, and the
    target's most likely tokens there as (id, text, logprob), best first."""

    id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    """What one committed token adds to the reply: its text (may be empty: held back, or a
    special token) and its logprobs entry (None unless asked)."""

    text: str
    logprob: TokenLogprob | None = None


class Reply:
    """The objects of one request's reply (ids, timestamps, layouts fixed per request)."""

    def __init__(self, generation: Generation, model: str):
        self.g, self.model = generation, model
        self.chat = generation.api == CHAT
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._offset = 0  # characters of text before the next token (completions' text_offset)
        self._first = True  # no chunk sent yet: the next carries the role
        self.tools = ToolReply(generation.tool_use) if generation.tool_use else None  # chat with tools

    def whole(self, text: str, deltas: list[Delta], finish: str, usage: dict, timings: dict) -> dict:
        logprobs = self._logprobs(deltas) if self.g.logprobs is not None else None
        if self.chat:
            message = {"role": "assistant", **(self.tools.message(text) if self.tools else {"content": text})}
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": self._reason(finish)}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": FINISH[finish]}
        return {**self._head(False), "choices": [choice], "usage": usage, "timings": timings}

    def chunks(self, deltas: list[Delta]) -> list[dict]:
        """The stream chunks for these tokens' text and logprobs: one, or with tools as many as
        the text releases content and call deltas (none where it is all held back)."""
        text = "".join(d.text for d in deltas)
        logprobs = self._logprobs(deltas) if self.g.logprobs is not None else None
        if not self.chat:
            return [{**self._head(True), "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                                                      "finish_reason": None}]}]
        parts = self.tools.deltas(text) if self.tools else [{"content": text}]
        if not parts and logprobs is not None:
            parts = [{}]
        return [self._chat_chunk(delta, logprobs if i == 0 else None) for i, delta in enumerate(parts)]

    def last_chunks(self, finish: str, usage: dict, timings: dict) -> list[dict]:
        """The chunk that says why the reply ended, with `timings` (and `usage`, unless a usage
        chunk follows: with stream_options.include_usage, the last chunk has no choices)."""
        flushed = [self._chat_chunk(delta, None) for delta in self.tools.last_deltas()] if self.tools else []
        end = {"index": 0, "delta": self._role({})} if self.chat else {"index": 0, "text": ""}
        end |= {"logprobs": None, "finish_reason": self._reason(finish)}
        chunks = [*flushed, {**self._head(True), "choices": [end], "timings": timings}]
        if self.g.include_usage:
            chunks.append({**self._head(True), "choices": [], "usage": usage, "timings": timings})
        else:
            chunks[-1]["usage"] = usage
        return chunks

    def _chat_chunk(self, delta: dict, logprobs: dict | None) -> dict:
        choice = {"index": 0, "delta": self._role(delta), "logprobs": logprobs, "finish_reason": None}
        return {**self._head(True), "choices": [choice]}

    def _role(self, delta: dict) -> dict:
        """The delta, with the role where it is the reply's first."""
        if self._first:
            self._first = False
            return {"role": "assistant", **delta}
        return delta

    def _reason(self, finish: str) -> str:
        """finish_reason: "tool_calls" where the model called tools and ended by itself."""
        called = self.tools is not None and self.tools.called
        return "tool_calls" if called and finish in ("eos", "stop") else FINISH[finish]

    def _head(self, stream: bool) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _spell(self, token_id: int, text: str) -> str:
        return f"token_id:{token_id}" if self.g.ids_as_tokens else text

    def _logprobs(self, deltas: list[Delta]) -> dict:
        entries = [d.logprob for d in deltas if d.logprob is not None]
        if self.chat:
            return {"content": [self._chat_entry(e.id, e.token, e.logprob)
                                | {"top_logprobs": [self._chat_entry(*alt) for alt in e.top]} for e in entries]}
        offsets = []
        for d in deltas:
            if d.logprob is not None:
                offsets.append(self._offset)
            self._offset += len(d.text)
        return {
            "tokens": [self._spell(e.id, e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self._spell(i, t): lp for i, t, lp in (*e.top, (e.id, e.token, e.logprob))}
                             for e in entries],
            "text_offset": offsets,
        }

    def _chat_entry(self, token_id: int, text: str, logprob: float) -> dict:
        return {"token": self._spell(token_id, text), "logprob": logprob, "bytes": list(text.encode("utf-8")),
                "id": token_id}


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None = None) -> dict:
    """OpenAI's usage; `cached`: the prompt tokens the prefix cache held (None: no cache, no details)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    return out if cached is None else out | {"prompt_tokens_details": {"cached_tokens": cached}}


def timings(stats: GenerationStats, prompt_n: int, predicted_n: int, queue_s: float, ttft_s: float | None,
            method: str, cache_n: int = 0) -> dict:
    """One request's figures from the engine's record of it. predicted_ms is the decode time
    after the prefill, and predicted_per_second the tokens returned after the first over it (the
    record's tokens_per_s counts those a stop string cut off too); the prefill (prompt_ms) yields
    the first token. prompt_n counts the prompt tokens forwarded, cache_n those the prefix cache
    held, as llama-server counts them."""
    prompt_s, decode_s = stats.prefill_seconds, stats.decode_seconds
    return {
        "prompt_n": prompt_n,
        "cache_n": cache_n,
        "prompt_ms": 1e3 * prompt_s,
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": 1e3 * decode_s,
        "predicted_per_second": (predicted_n - 1) / decode_s if decode_s > 0 and predicted_n > 1 else 0.0,
        "draft_n": stats.proposed,
        "draft_n_accepted": stats.accepted,
        "drafts": stats.drafts,
        "rounds": stats.rounds,
        "mean_accepted_length": stats.mean_accepted_length,
        "acceptance_rate": stats.acceptance_rate,
        "accepted_per_position": list(stats.position_accepted),
        "acceptance_per_position": stats.position_acceptance,
        "target_calls": stats.target_calls,
        "draft_calls": stats.draft_calls,
        "phase_ms": {phase: 1e3 * seconds for phase, seconds in stats.times.items()},
        "queue_ms": 1e3 * queue_s,
        "ttft_ms": None if ttft_s is None else 1e3 * ttft_s,
        "method": method,
    }
