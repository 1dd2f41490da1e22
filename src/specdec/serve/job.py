"""One request between the HTTP side and the decode worker (Job), the jobs waiting for the
worker (JobQueue), and what the worker does for a job while it decodes (Decode: its text
stream, stop strings, logprobs, metrics and timings).

The worker talks to the HTTP side only through Jobs: each holds a checked Generation, a cancel
flag the HTTP side sets (client gone, server stopping), and an asyncio queue the worker fills,
from its thread, with Tokens events (per round), then one Finished, for each of the request's n
choices (the events name their choice's index); or a Failed, which ends the whole request.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from dataclasses import dataclass

from .errors import ApiError
from .metrics import ServerMetrics
from .request import Generation
from .respond import Delta, TokenLogprob, timings, usage
from .text import TextStream, piece

LOGPROB_FLOOR = -9999.0  # -inf is not JSON: log-probabilities are clamped here, as vLLM does


@dataclass(frozen=True)
class Tokens:
    deltas: list[Delta]
    index: int = 0  # the choice


@dataclass(frozen=True)
class Finished:
    text: str
    finish: str  # "stop", "length", "cancelled"
    usage: dict
    timings: dict
    index: int = 0  # the choice


@dataclass(frozen=True)
class Failed:
    error: ApiError


class Job:
    """One request between the HTTP side (its event loop) and the worker thread."""

    def __init__(self, generation: Generation, loop: asyncio.AbstractEventLoop):
        self.generation = generation
        self.arrived = time.perf_counter()
        self.deadline: float | None = None  # perf_counter time past which the worker drops it
        self.events: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event) -> None:
        """From the worker thread: hand an event to the request's handler. Never blocks (the
        event waits in the handler's unbounded queue), so a client that stops reading holds
        no one but itself."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopped): nobody listens
            pass


class Decode:
    """One choice of a job in the worker's scheduler (`index`: 0..n-1): the engine's on_commit /
    on_target_logits hooks turn committed tokens into text deltas (cut at a stop string) with
    logprobs, and record the time-to-first-token and inter-token latencies; start() marks the
    end of its wait, finish() sends the last events. Choice 0 is the one the job queue counted
    and the one whose prompt tokens the metrics count (once per request, as usage does)."""

    def __init__(self, job: Job, name: str, metrics: ServerMetrics, tokenizer, tokenizer_lock: threading.Lock,
                 index: int = 0):
        self.job, self.name, self.metrics, self.index = job, name, metrics, index
        self.tokenizer, self.tokenizer_lock = tokenizer, tokenizer_lock
        g = job.generation
        self.started = self.queue_s = 0.0
        self.text = TextStream(tokenizer, g.stop, tokenizer_lock)
        self.rows: list = []  # the target's rows of the round being committed (logprobs)
        self.kept = 0
        self.first_at: float | None = None
        self.last_at = self.started
        self.failed = False

    def start(self) -> None:
        """The scheduler starts it: its wait ends, it counts as running."""
        self.started = time.perf_counter()
        self.queue_s = self.started - self.job.arrived
        self.metrics.queue_time.labels(self.name).observe(self.queue_s)
        self.metrics.running.labels(self.name).inc()

    @property
    def on_target_logits(self):
        return self.rows.append if self.job.generation.logprobs is not None else None

    def on_commit(self, tokens: list[int], from_draft: int) -> bool:
        now, m = time.perf_counter(), self.metrics
        if self.first_at is None:
            self.first_at = now
            m.ttft.labels(self.name).observe(now - self.job.arrived)
        else:
            for _ in tokens:
                m.itl.labels(self.name).observe((now - self.last_at) / len(tokens))
        self.last_at = now
        top = self.job.generation.logprobs
        entries = self._logprobs(self.rows.pop(), tokens, top) if self.rows else [None] * len(tokens)
        deltas = []
        for token, entry in zip(tokens, entries):
            deltas.append(Delta(self.text.push(token), entry))
            self.kept += 1
            if self.text.stopped:
                break
        self.job.put(Tokens(deltas, self.index))
        return self.text.stopped or self.job.cancelled

    def finish(self, result, method: str, cached: int | None = None) -> float:
        """Send the text's tail and Finished for the engine's result; the request's decode
        seconds. `cached`: the prompt tokens its start took from the prefix cache (None: no
        cache). What may raise comes before anything is counted or sent (then fail() answers)."""
        m, g = self.metrics, self.job.generation
        if result.finish_reason == "stopped":
            finish = "stop" if self.text.stopped else "cancelled"
        else:
            finish = "stop" if result.finish_reason == "eos" else "length"
        tail = self.text.finish()
        ttft = None if self.first_at is None else self.first_at - self.job.arrived
        figures = timings(result.stats, len(g.prompt_ids) - (cached or 0), self.kept, self.queue_s, ttft, method,
                          cached or 0)
        m.running.labels(self.name).dec()
        if tail:
            self.job.put(Tokens([Delta(tail)], self.index))
        m.ended(finish, self.prompt_counted, self.kept, result.stats)
        if cached is not None:
            m.prefix_cache(len(g.prompt_ids), cached)
        m.e2e.labels(self.name).observe(time.perf_counter() - self.job.arrived)
        self.job.put(Finished(self.text.text, finish, usage(len(g.prompt_ids), self.kept, cached), figures,
                              self.index))
        return time.perf_counter() - self.started

    def fail(self, error: ApiError) -> None:
        self.failed = True
        self.metrics.running.labels(self.name).dec()
        self.metrics.ended("error", self.prompt_counted, self.kept, None)
        self.job.put(Failed(error))

    @property
    def prompt_counted(self) -> int:
        """The prompt tokens the metrics add for this choice: the prompt's, once per request."""
        return len(self.job.generation.prompt_ids) if self.index == 0 else 0

    def _logprobs(self, rows, tokens: list[int], top: int) -> list[TokenLogprob]:
        """The target's log-probabilities (raw logits, no temperature or truncation, as vLLM and
        OpenAI give them) of the committed tokens and their `top` best alternatives."""
        import torch

        logp = torch.log_softmax(rows[: len(tokens)].float(), dim=-1)
        chosen = logp.gather(1, torch.tensor(tokens, device=logp.device).view(-1, 1)).view(-1).tolist()
        best = logp.topk(top, dim=-1) if top else None
        values, ids = (best.values.tolist(), best.indices.tolist()) if best is not None else ([], [])
        with self.tokenizer_lock:
            return [TokenLogprob(token, piece(self.tokenizer, token), max(lp, LOGPROB_FLOOR),
                                 tuple((i, piece(self.tokenizer, i), max(v, LOGPROB_FLOOR))
                                       for i, v in zip(ids[n], values[n])) if best is not None else ())
                    for n, (token, lp) in enumerate(zip(tokens, chosen))]


class JobQueue:
    """The jobs submitted and not yet started (up to `bound`: --max-queue), counted from submit
    to their start or refusal, so a cancelled one leaves its place at once; the HTTP side puts,
    the worker thread takes."""

    def __init__(self, bound: int, metrics: ServerMetrics, name: str):
        self.bound, self.metrics, self.name = bound, metrics, name
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.waiting = 0

    def put(self, job: Job, retry_s: float) -> None:
        """Queue `job`, or a 503 with Retry-After (about `retry_s` a waiting request) when full."""
        with self._lock:
            if self.waiting >= self.bound:
                self.metrics.reject("queue_full")
                wait = max(1, math.ceil(retry_s * self.waiting))
                raise ApiError(503, f"the server is busy: {self.waiting} requests are waiting (--max-queue); "
                                    f"retry in about {wait} s", code="queue_full", headers={"Retry-After": str(wait)})
            self.waiting += 1
            self._jobs.put(job)
        self.metrics.waiting.labels(self.name).inc()

    def take(self, block: bool) -> Job | None:
        """The next job (None: none without blocking, or a wake-up)."""
        try:
            return self._jobs.get(block=block)
        except queue.Empty:
            return None

    def wake(self) -> None:
        self._jobs.put(None)

    def left(self) -> None:
        """A job stopped waiting: it started, or was refused or cancelled before it did."""
        with self._lock:
            self.waiting -= 1
        self.metrics.waiting.labels(self.name).dec()

    def refuse_all(self, error: ApiError) -> None:
        """Answer every job not yet taken with `error`."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self.left()
                job.put(Failed(error))
