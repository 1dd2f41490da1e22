"""The decode worker: one thread that loads the models, owns them, and decodes the queued
requests together (continuous batching, decode.batch): requests join the batch between rounds,
up to --max-sequences at once and within the K/V budget (--kv-tokens positions held together, a
request reserving its prompt, its max_tokens and a round's guesses; a prompt that arrives while
others run is forwarded in chunks inside their rounds), and leave at their end. Each round, every running request guesses as many tokens as the
cost model finds worth it for the block the whole batch verifies (decode.plan).

Requests wait in a bounded queue (full: 503 with Retry-After). The worker talks to the HTTP side
only through Jobs (serve.job). A cancelled job still in the queue is skipped; a running one stops
at its next round (the engine's on_commit returns True), with its numbers counted.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SpecdecError
from .errors import ApiError
from .job import Decode, Failed, Finished, Job
from .metrics import ServerMetrics
from .request import Defaults, Model
from .respond import usage

WARMUP_TOKENS = 4
# Rows a round's target forward is filled up to with joining prompts (Limits.round_rows). On
# the Zen 4 at 8 clients arriving ~1 s apart, 64 rows cut a running stream's longest stall from
# 2.6 s (p99 5.6) with prompts prefilled alone to 0.4 s (p99 0.6), for 0.98x the tokens in all
# and first tokens 0.4 s later; 16 rows stalled 0.14 s but cost 0.93x and 1 s (docs/serving.md,
# "Chunked prefill").
ROUND_ROWS = 64


@dataclass
class Loaded:
    """What the worker decodes with: the target's runtime, its tokenizer, the proposer (None:
    plain decoding) and the method's label."""

    lm: object
    tokenizer: object
    drafter: object | None
    method: str
    plan: object | None = None  # decode.batch.Plan: guesses per request and round (None: the proposer's k)


@dataclass(frozen=True)
class Limits:
    """How many requests decode at once and how many positions their K/V caches may hold
    together (each request reserves prompt + max_tokens + its guesses); the rows a round's target
    forward is filled up to with the prompts of requests that arrive while others decode (0:
    each such prompt prefilled alone, the rounds waiting)."""

    sequences: int = 8
    kv_tokens: int = 32768
    round_rows: int = ROUND_ROWS


class DecodeWorker:
    def __init__(self, load: Callable[[], Loaded], metrics: ServerMetrics, name: str, defaults: Defaults,
                 max_queue: int, on_load_failure: Callable[[BaseException], None] | None = None,
                 limits: Limits = Limits()):
        self.metrics, self.name, self.defaults = metrics, name, defaults
        self.state = "loading"  # then "ready", or "failed" (load_error says why), or "stopped"
        self.load_error: BaseException | None = None
        self.loaded: Loaded | None = None
        self.model: Model | None = None
        self.tokenizer_lock = threading.Lock()
        self._load, self.on_load_failure = load, on_load_failure
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._stopping = threading.Event()
        self.limits = limits
        self._decoding: dict = {}  # Decoding -> Decode, the running requests
        self._held: Job | None = None  # taken from the queue, waiting for room in the batch
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
        """Stop decoding: running requests end at their next round, waiting ones are refused."""
        self._stopping.set()
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
            self.model = Model(self.name, lm.vocab_size, lm.max_positions, self.defaults)
            self._warm_up()
        except BaseException as e:  # noqa: BLE001 - the server reports it and stops
            self.load_error, self.state = e, "failed"
            if self.on_load_failure:
                self.on_load_failure(e)
            return
        self.state = "ready"
        joining = (f"prompts joining in rounds of up to {self.limits.round_rows} rows" if self.limits.round_rows
                   else "prompts prefilled alone")
        print(f"[specdec] serving {self.name} ({self.loaded.method}; up to {self.limits.sequences} requests at "
              f"once, {self.limits.kv_tokens} K/V positions, {joining})", file=sys.stderr, flush=True)
        from ..decode.batch import Batch

        batch = Batch(self.loaded.lm, self.loaded.drafter, self.loaded.plan, self.limits.round_rows)
        while True:
            if not self._admit(batch):
                break
            if batch.sequences:
                self._round(batch)
        for d in batch.sequences:  # stopping: what runs ends now, counted as cancelled
            batch.remove(d)
            self._decoding.pop(d).finish(d.result("stopped"), self.loaded.method)
        if self._held is not None:
            self._held.put(Failed(ApiError(503, "the server is stopping", code="stopping")))
        retimed = getattr(self.loaded.plan, "retimed", None)
        if retimed is not None:  # how far serving moved the costs timed at start
            print(f"[specdec] the batch plan's costs while serving, over those timed at start: {retimed()}",
                  file=sys.stderr, flush=True)
        self.state = "stopped"

    def _warm_up(self) -> None:
        """One short greedy generation, so the first request does not pay one-time costs (weight
        packing, kernel selection); then the runtime's own cache is given back."""
        from ..decode.engine import generate

        loaded = self.loaded
        prompt = list(range(1, 1 + min(8, loaded.lm.vocab_size - 1)))
        generate(loaded.lm, prompt, drafter=loaded.drafter, max_new_tokens=WARMUP_TOKENS, eos_token_id=[])
        draft_lm = loaded.drafter.draft_lm if loaded.drafter is not None else None
        for lm in (loaded.lm, draft_lm):  # requests decode on lanes of their own
            if lm is not None:
                lm.release()

    def _admit(self, batch) -> bool:
        """Start waiting requests while the batch has room (waiting for one when nothing runs);
        False once the server stops."""
        while not self._stopping.is_set():
            job = self._held
            if job is None:
                try:
                    job = self._queue.get(block=not batch.sequences)
                except queue.Empty:
                    return True
                if job is None:
                    break
                self.metrics.waiting.labels(self.name).dec()
            if job.cancelled:  # its client left while it waited
                self._held = None
                self.metrics.ended("cancelled", 0, 0, None)
                job.put(Finished("", "cancelled", usage(0, 0), {}))
                continue
            if batch.sequences and not self._room_for(job):
                self._held = job  # it starts when a running request leaves
                return True
            self._held = None
            self._start(batch, job)
        return False

    def _room_for(self, job: Job) -> bool:
        return (len(self._decoding) < self.limits.sequences
                and self._reserved(job) + sum(self._reserved(r.job) for r in self._decoding.values())
                <= self.limits.kv_tokens)

    def _reserved(self, job: Job) -> int:
        drafter = self.loaded.drafter
        g = job.generation
        return len(g.prompt_ids) + g.max_tokens + (drafter.k if drafter is not None else 0) + 1

    def _start(self, batch, job: Job) -> None:
        from ..decode.sampling import SamplingConfig
        from ..decode.sequence import Options

        g, s = job.generation, job.generation.sampling
        decode = Decode(job, self.name, self.metrics, self.loaded.tokenizer, self.tokenizer_lock,
                        self._stopping.is_set)
        options = Options(g.max_tokens, SamplingConfig(s.temperature, s.top_k, s.top_p, s.min_p), s.seed,
                          [] if g.ignore_eos else None, decode.on_commit, decode.on_target_logits)
        try:
            d = batch.add(list(g.prompt_ids), options, self._reserved(job))
        except Exception as e:  # noqa: BLE001 - one request fails, the server goes on
            decode.fail(self._error(e))
            return
        if d.finished:
            self._ended(decode, d.result())
        else:
            self._decoding[d] = decode

    def _round(self, batch) -> None:
        try:
            ended = batch.step()
        except Exception as e:  # noqa: BLE001 - a round failed as a whole: its requests fail, the server goes on
            ended = [(d, e) for d in batch.sequences]
            for d, _ in ended:
                batch.remove(d)
        for d, error in ended:
            decode = self._decoding.pop(d)
            if error is not None:
                decode.fail(self._error(error))
            else:
                self._ended(decode, d.result())

    def _ended(self, decode: Decode, result) -> None:
        seconds = decode.finish(result, self.loaded.method)
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    @staticmethod
    def _error(e: Exception) -> ApiError:
        status = 400 if isinstance(e, SpecdecError) else 500
        if status == 500:
            traceback.print_exception(e)
        return ApiError(status, f"decoding failed: {e}", code="decode_failed")

