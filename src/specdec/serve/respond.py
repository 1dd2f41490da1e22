"""The OpenAI response objects: whole replies, stream chunks, logprobs in both APIs' layouts,
`usage`, and `timings`: llama-server's names where it has them (prompt_n, prompt_ms,
predicted_n, predicted_ms, predicted_per_second, draft_n, draft_n_accepted), so tools that read
llama-server read specdec, and specdec's speculation figures beside them (rounds,
mean_accepted_length, acceptance per position, time per phase)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

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


class Ending(Protocol):
    """How one choice ended (serve.job.Finished)."""

    text: str
    finish: str
    usage: dict
    timings: dict


class _Choice:
    """What one choice's reply carries from chunk to chunk."""

    def __init__(self, generation: Generation):
        self.offset = 0  # characters of text before the next token (completions' text_offset)
        self.first = True  # no chunk sent yet: the next carries the role
        self.tools = ToolReply(generation.tool_use) if generation.tool_use else None  # chat with tools


class Reply:
    """The objects of one request's reply (ids, timestamps, layouts fixed per request): `choices`
    indexed 0..n-1, each with its own text, logprobs and finish_reason; usage counts the prompt
    once and the completion tokens of every choice; `timings` is choice 0's (the one that
    forwarded the prompt), and with n > 1 each choice carries its own."""

    def __init__(self, generation: Generation, model: str):
        self.g, self.model = generation, model
        self.chat = generation.api == CHAT
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._choices = [_Choice(generation) for _ in range(generation.n)]
        self._ended: dict[int, Ending] = {}

    @property
    def done(self) -> bool:
        """Whether every choice has ended (last_chunks was given each)."""
        return len(self._ended) == len(self._choices)

    def whole(self, ends: Sequence[Ending], deltas: Sequence[list[Delta]]) -> dict:
        """The whole reply from every choice's end and deltas, in index order."""
        choices = [self._whole_choice(i, end, d) for i, (end, d) in enumerate(zip(ends, deltas))]
        return {**self._head(False), "choices": choices, "usage": total_usage([e.usage for e in ends]),
                "timings": ends[0].timings}

    def _whole_choice(self, index: int, end: Ending, deltas: list[Delta]) -> dict:
        state = self._choices[index]
        logprobs = self._logprobs(state, deltas) if self.g.logprobs is not None else None
        if self.chat:
            message = {"role": "assistant", **(state.tools.message(end.text) if state.tools else {"content": end.text})}
            choice = {"index": index, "message": message, "logprobs": logprobs,
                      "finish_reason": self._reason(state, end.finish)}
        else:
            choice = {"index": index, "text": end.text, "logprobs": logprobs, "finish_reason": FINISH[end.finish]}
        return choice | ({"timings": end.timings} if len(self._choices) > 1 else {})

    def chunks(self, deltas: list[Delta], index: int = 0) -> list[dict]:
        """The stream chunks for these tokens' text and logprobs of choice `index`: one, or with
        tools as many as the text releases content and call deltas (none where it is all held back)."""
        state = self._choices[index]
        text = "".join(d.text for d in deltas)
        logprobs = self._logprobs(state, deltas) if self.g.logprobs is not None else None
        if not self.chat:
            return [{**self._head(True), "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                                      "finish_reason": None}]}]
        parts = state.tools.deltas(text) if state.tools else [{"content": text}]
        if not parts and logprobs is not None:
            parts = [{}]
        return [self._chat_chunk(index, delta, logprobs if i == 0 else None) for i, delta in enumerate(parts)]

    def last_chunks(self, end: Ending, index: int = 0) -> list[dict]:
        """The chunk that says why choice `index` ended, with its `timings`; after the last choice
        also the request's `usage` (in a chunk of its own, without choices, with
        stream_options.include_usage; else in that last chunk)."""
        state = self._choices[index]
        self._ended[index] = end
        flushed = [self._chat_chunk(index, delta, None) for delta in state.tools.last_deltas()] if state.tools else []
        last = {"index": index, "delta": self._role(state, {})} if self.chat else {"index": index, "text": ""}
        last |= {"logprobs": None, "finish_reason": self._reason(state, end.finish)}
        chunks = [*flushed, {**self._head(True), "choices": [last], "timings": end.timings}]
        if not self.done:
            return chunks
        usage = total_usage([e.usage for e in self._ended.values()])
        if self.g.include_usage:
            chunks.append({**self._head(True), "choices": [], "usage": usage, "timings": self._ended[0].timings})
        else:
            chunks[-1]["usage"] = usage
        return chunks

    def _chat_chunk(self, index: int, delta: dict, logprobs: dict | None) -> dict:
        choice = {"index": index, "delta": self._role(self._choices[index], delta), "logprobs": logprobs,
                  "finish_reason": None}
        return {**self._head(True), "choices": [choice]}

    @staticmethod
    def _role(state: _Choice, delta: dict) -> dict:
        """The delta, with the role where it is the choice's first."""
        if state.first:
            state.first = False
            return {"role": "assistant", **delta}
        return delta

    @staticmethod
    def _reason(state: _Choice, finish: str) -> str:
        """finish_reason: "tool_calls" where the model called tools and ended by itself."""
        called = state.tools is not None and state.tools.called
        return "tool_calls" if called and finish in ("eos", "stop") else FINISH[finish]

    def _head(self, stream: bool) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _spell(self, token_id: int, text: str) -> str:
        return f"token_id:{token_id}" if self.g.ids_as_tokens else text

    def _logprobs(self, state: _Choice, deltas: list[Delta]) -> dict:
        entries = [d.logprob for d in deltas if d.logprob is not None]
        if self.chat:
            return {"content": [self._chat_entry(e.id, e.token, e.logprob)
                                | {"top_logprobs": [self._chat_entry(*alt) for alt in e.top]} for e in entries]}
        offsets = []
        for d in deltas:
            if d.logprob is not None:
                offsets.append(state.offset)
            state.offset += len(d.text)
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


def total_usage(usages: Sequence[dict]) -> dict:
    """The usage of a request's choices together: the prompt once (as OpenAI counts it, with
    choice 0's cached tokens: what the prompt found in the cache), every choice's completion
    tokens."""
    first = usages[0]
    prompt = max(u["prompt_tokens"] for u in usages)  # a choice cancelled before it started counts none
    completion = sum(u["completion_tokens"] for u in usages)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return out | ({"prompt_tokens_details": first["prompt_tokens_details"]} if "prompt_tokens_details" in first
                  else {})


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
