"""The decode worker: one thread that loads the models, owns them, and decodes the queued
requests one at a time.

Requests wait in a bounded queue (full: 503 with Retry-After). The worker talks to the HTTP side
only through Jobs: each holds a checked Generation, a cancel flag the HTTP side sets (client
gone, server stopping), and an asyncio queue the worker fills, from its thread, with Tokens
events (per round), then one Finished or Failed. A cancelled job still in the queue is skipped;
a running one stops at its next round (the engine's on_commit returns True), with its numbers
counted. Continuous batching would replace `_decode` by a loop over the running jobs' rounds,
keeping the same Job and event protocol.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SpecdecError
from .errors import ApiError
from .metrics import ServerMetrics
from .request import Defaults, Generation, Model
from .respond import Delta, TokenLogprob, timings, usage
from .text import TextStream, piece

LOGPROB_FLOOR = -9999.0  # -inf is not JSON: log-probabilities are clamped here, as vLLM does
WARMUP_TOKENS = 4


@dataclass
class Loaded:
    """What the worker decodes with: the target's runtime, its tokenizer, the proposer (None:
    plain decoding) and the method's label."""

    lm: object
    tokenizer: object
    drafter: object | None
    method: str


@dataclass(frozen=True)
class Tokens:
    deltas: list[Delta]


@dataclass(frozen=True)
class Finished:
    text: str
    finish: str  # "stop", "length", "cancelled"
    usage: dict
    timings: dict


@dataclass(frozen=True)
class Failed:
    error: ApiError


class Job:
    """One request between the HTTP side (its event loop) and the worker thread."""

    def __init__(self, generation: Generation, loop: asyncio.AbstractEventLoop):
        self.generation = generation
        self.arrived = time.perf_counter()
        self.events: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event) -> None:
        """From the worker thread: hand an event to the request's handler."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopped): nobody listens
            pass


class DecodeWorker:
    def __init__(self, load: Callable[[], Loaded], metrics: ServerMetrics, name: str, defaults: Defaults,
                 max_queue: int, on_load_failure: Callable[[BaseException], None] | None = None):
        self.metrics, self.name, self.defaults = metrics, name, defaults
        self.state = "loading"  # then "ready", or "failed" (load_error says why), or "stopped"
        self.load_error: BaseException | None = None
        self.loaded: Loaded | None = None
        self.model: Model | None = None
        self.tokenizer_lock = threading.Lock()
        self._load, self.on_load_failure = load, on_load_failure
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._stopping = threading.Event()
        self._current: Job | None = None
        self._mean_s = 1.0  # moving average of a request's decode time, for Retry-After
        self._thread = threading.Thread(target=self._run, name="specdec-decode", daemon=True)

    # --- the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._stopping.is_set():
            raise ApiError(503, "the server is stopping: send the request to another server", code="stopping")
        if self.state != "ready":
            raise self.not_ready()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.metrics.reject("queue_full")
            wait = max(1, math.ceil(self._mean_s * self._queue.qsize()))
            raise ApiError(503, f"the server is busy: {self._queue.qsize()} requests are waiting (--max-queue); "
                                f"retry in about {wait} s", code="queue_full",
                           headers={"Retry-After": str(wait)}) from None
        self.metrics.waiting.labels(self.name).inc()

    def not_ready(self) -> ApiError:
        if self.state == "loading":
            return ApiError(503, "the model is loading: retry once GET /health answers 200", code="loading",
                            headers={"Retry-After": "5"})
        if self.state == "failed":
            return ApiError(503, f"the model failed to load: {self.load_error}", code="load_failed")
        return ApiError(503, "the server is stopping", code="stopping")

    def encode_text(self, text: str) -> list[int]:
        from ..prompts.chat import encode_prompt

        with self.tokenizer_lock:
            return encode_prompt(self.loaded.tokenizer, text, raw=True)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        from ..prompts.chat import encode_messages

        try:
            with self.tokenizer_lock:
                return encode_messages(self.loaded.tokenizer, messages)
        except SpecdecError as e:
            raise ApiError(400, str(e), "messages", "unsupported_messages") from None
        except Exception as e:  # a template's own error (e.g. a role it does not take)
            raise ApiError(400, f"the model's chat template refused these messages: {e}", "messages",
                           "chat_template_error") from None

    def stop(self) -> None:
        """Stop decoding: the running request ends at its next round, waiting ones are refused."""
        self._stopping.set()
        if self._current is not None:
            self._current.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.metrics.waiting.labels(self.name).dec()
                job.put(Failed(ApiError(503, "the server is stopping", code="stopping")))
        try:
            self._queue.put_nowait(None)  # wakes the worker
        except queue.Full:
            pass

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.loaded = self._load()
            lm = self.loaded.lm
            self.model = Model(self.name, lm.vocab_size, lm.max_positions, self.defaults, takes_min_p())
            self._warm_up()
        except BaseException as e:  # noqa: BLE001 - the server reports it and stops
            self.load_error, self.state = e, "failed"
            if self.on_load_failure:
                self.on_load_failure(e)
            return
        self.state = "ready"
        print(f"[specdec] serving {self.name} ({self.loaded.method})", file=sys.stderr, flush=True)
        while not self._stopping.is_set():
            job = self._queue.get()
            if job is None:
                break
            self.metrics.waiting.labels(self.name).dec()
            if job.cancelled:  # its client left while it waited
                self.metrics.ended("cancelled", 0, 0, None)
                job.put(Finished("", "cancelled", usage(0, 0), {}))
                continue
            self._current = job
            try:
                self._decode(job)
            finally:
                self._current = None
        self.state = "stopped"

    def _warm_up(self) -> None:
        """One short greedy generation, so the first request does not pay one-time costs (weight
        packing, kernel selection)."""
        from ..decode.engine import generate

        loaded = self.loaded
        prompt = list(range(1, 1 + min(8, loaded.lm.vocab_size - 1)))
        generate(loaded.lm, prompt, drafter=loaded.drafter, max_new_tokens=WARMUP_TOKENS, eos_token_id=[])

    def _decode(self, job: Job) -> None:
        from ..decode.engine import generate

        g, s, loaded = job.generation, job.generation.sampling, self.loaded
        m = self.metrics
        started = time.perf_counter()
        queue_s = started - job.arrived
        m.queue_time.labels(self.name).observe(queue_s)
        m.running.labels(self.name).inc()
        text = TextStream(loaded.tokenizer, g.stop, self.tokenizer_lock)
        rows: list = []
        kept = 0
        first_at: float | None = None
        last_at = started

        def on_commit(tokens: list[int], from_draft: int) -> bool:
            nonlocal kept, first_at, last_at
            now = time.perf_counter()
            if first_at is None:
                first_at = now
                m.ttft.labels(self.name).observe(now - job.arrived)
            else:
                for _ in tokens:
                    m.itl.labels(self.name).observe((now - last_at) / len(tokens))
            last_at = now
            entries = self._logprobs(rows.pop(), tokens, g.logprobs) if rows else [None] * len(tokens)
            deltas = []
            for token, entry in zip(tokens, entries):
                deltas.append(Delta(text.push(token), entry))
                kept += 1
                if text.stopped:
                    break
            job.put(Tokens(deltas))
            return text.stopped or job.cancelled or self._stopping.is_set()

        extra = {"min_p": s.min_p} if s.min_p is not None else {}
        try:
            result = generate(
                loaded.lm, list(g.prompt_ids), drafter=loaded.drafter, max_new_tokens=g.max_tokens,
                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                eos_token_id=[] if g.ignore_eos else None, on_commit=on_commit,
                on_target_logits=rows.append if g.logprobs is not None else None, **extra)
        except Exception as e:  # noqa: BLE001 - one request fails, the server goes on
            status = 400 if isinstance(e, SpecdecError) else 500
            if status == 500:
                traceback.print_exc()
            m.ended("error", len(g.prompt_ids), kept, None)
            job.put(Failed(ApiError(status, f"decoding failed: {e}", code="decode_failed")))
            return
        finally:
            m.running.labels(self.name).dec()
        if result.finish_reason == "stopped":
            finish = "stop" if text.stopped else "cancelled"
        else:
            finish = "stop" if result.finish_reason == "eos" else "length"
        tail = text.finish()
        if tail:
            job.put(Tokens([Delta(tail)]))
        ttft = None if first_at is None else first_at - job.arrived
        figures = timings(result.stats, len(g.prompt_ids), kept, queue_s, ttft, loaded.method)
        m.ended(finish, len(g.prompt_ids), kept, figures)
        m.e2e.labels(self.name).observe(time.perf_counter() - job.arrived)
        self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - started)
        job.put(Finished(text.text, finish, usage(len(g.prompt_ids), kept), figures))

    def _logprobs(self, rows, tokens: list[int], top: int) -> list[TokenLogprob]:
        """The target's log-probabilities (raw logits, no temperature or truncation, as vLLM and
        OpenAI give them) of the committed tokens and their `top` best alternatives."""
        import torch

        logp = torch.log_softmax(rows[: len(tokens)].float(), dim=-1)
        chosen = logp.gather(1, torch.tensor(tokens, device=logp.device).view(-1, 1)).view(-1).tolist()
        best = logp.topk(top, dim=-1) if top else None
        values, ids = (best.values.tolist(), best.indices.tolist()) if best is not None else ([], [])
        tokenizer = self.loaded.tokenizer
        with self.tokenizer_lock:
            return [TokenLogprob(token, piece(tokenizer, token), max(lp, LOGPROB_FLOOR),
                                 tuple((i, piece(tokenizer, i), max(v, LOGPROB_FLOOR))
                                       for i, v in zip(ids[n], values[n])) if best is not None else ())
                    for n, (token, lp) in enumerate(zip(tokens, chosen))]


def takes_min_p() -> bool:
    """Whether the engine's generate takes min_p (a sampling option being added beside this)."""
    from ..decode.engine import generate

    return "min_p" in inspect.signature(generate).parameters
