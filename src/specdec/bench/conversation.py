"""A conversation bench: every conversation sent turn by turn to every server, each turn's request
the whole history so far (the user's messages and the server's own earlier answers), as chat
clients do, streamed through the official openai client with the server's prompt cache allowed
(llama-server's `cache_prompt`), greedy.

Per turn: the prompt's tokens and how many of them the server had cached (usage's
prompt_tokens_details.cached_tokens, else llama.cpp's timings.cache_n), time to first token, the
decode tokens (after the first chunk) over the decode time (first to last chunk), the turn's wall
time and its answer; per conversation: its wall time. One row per conversation and server in
results.jsonl, written (fsynced) once the conversation has ended: a conversation cut short is
run again from its start on --resume, since its later turns depend on its answers.

Order: N consecutive conversations (--concurrency N) form a wave that one server serves at once
(each conversation on its own thread), then the next server the same wave; the servers' order
rotates from wave to wave, so slow drifts of the machine hit them alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..external.endpoints.spec import MESSAGE, Endpoint
from ..external.endpoints.stream import Request, Streamed, complete_openai
from ..prompts.conversations import Conversation
from .store import RowWriter, read_rows

WARMUP_MESSAGE, WARMUP_TOKENS = "Say hello.", 8


@dataclass(frozen=True)
class Server:
    """An endpoint to converse with: its /v1/chat/completions, the model it serves and the
    openai client that talks to it (external.endpoints.stream.openai_client)."""

    name: str
    endpoint: Endpoint
    model: str
    client: object


def say(server: Server, messages: list[dict], max_tokens: int) -> dict:
    """One turn: `messages` (the history, ending with the user's message) sent as they are; the
    turn's measurements and answer."""
    request = Request(max_tokens, messages=list(messages), top_logprobs=0, cache_prompt=True)
    streamed = complete_openai(server.client, server.endpoint, server.model, request, MESSAGE)
    return turn_fields(streamed, time.perf_counter() - streamed.sent)


def turn_fields(s: Streamed, wall_s: float) -> dict:
    """A turn's row fields. Without logprobs each chunk counts one token but the server's count
    (usage) is the turn's: decode_tokens is that count less the first chunk's token."""
    timings = s.timings or {}
    return {"prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens, "completion_tokens": s.n_tokens,
            "ttft_s": s.ttft_s, "decode_tokens": s.decode_tokens, "decode_s": s.decode_s,
            "decode_tokens_per_s": s.decode_tokens / s.decode_s if s.decode_tokens and s.decode_s > 0 else None,
            "wall_s": wall_s, "finish_reason": s.finish_reason, "chunks": len(s.stamps),
            "proposed": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted"), "text": s.text}


def converse(server: Server, conversation: Conversation, max_tokens: int) -> dict:
    """The whole conversation on `server`, each answer joining the history the next turn sends."""
    messages: list[dict] = []
    turns = []
    start = time.perf_counter()
    for text in conversation.turns:
        messages.append({"role": "user", "content": text})
        turn = say(server, messages, max_tokens)
        messages.append({"role": "assistant", "content": turn["text"]})
        turns.append(turn)
    return {"server": server.name, "conversation": conversation.id, "category": conversation.category,
            "wall_s": time.perf_counter() - start, "turns": turns}


def warm_up(server: Server) -> None:
    """One short request, not measured: the server's first request pays for what it loads late."""
    say(server, [{"role": "user", "content": WARMUP_MESSAGE}], WARMUP_TOKENS)


@dataclass(frozen=True)
class Wave:
    server: Server
    conversations: list[Conversation]


def pending_waves(conversations: list[Conversation], servers: list[Server], concurrency: int,
                  done: set[tuple[str, str]]) -> list[Wave]:
    """Each wave of `concurrency` consecutive conversations on each server, the servers rotated
    by one from wave to wave, less the (server, conversation) rows in `done`."""
    waves = []
    for start in range(0, len(conversations), concurrency):
        group = conversations[start:start + concurrency]
        shift = (start // concurrency) % len(servers)
        for server in servers[shift:] + servers[:shift]:
            todo = [c for c in group if (server.name, c.id) not in done]
            if todo:
                waves.append(Wave(server, todo))
    return waves


def run_conversations(out: Path, config: dict, conversations: list[Conversation], servers: list[Server],
                      max_tokens: int, concurrency: int = 1, progress: bool = True,
                      warm: Callable[[Server], None] = warm_up) -> None:
    """Every pending wave, each server warmed up once before its first; rows into `out`."""
    done = {(r["server"], r["conversation"]) for r in read_rows(out)}
    waves = pending_waves(conversations, servers, concurrency, done)
    for server in {w.server.name: w.server for w in waves}.values():
        warm(server)
    with RowWriter(out, config) as writer, tqdm(total=sum(len(w.conversations) for w in waves),
                                                disable=not progress, desc="conversations") as bar:
        for wave in waves:
            for row in _serve(wave, max_tokens):
                writer.write(row)
                bar.update(1)


def _serve(wave: Wave, max_tokens: int) -> list[dict]:
    """The wave's conversations on its server, all at once (one alone runs on this thread, so that
    Ctrl-C stops it at once)."""
    if len(wave.conversations) == 1:
        return [converse(wave.server, wave.conversations[0], max_tokens)]
    with ThreadPoolExecutor(max_workers=len(wave.conversations)) as pool:
        return list(pool.map(lambda c: converse(wave.server, c, max_tokens), wave.conversations))
