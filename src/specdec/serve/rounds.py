"""The decode worker thread's loop (Rounds): jobs from the JobQueue into the decode scheduler
(decode.scheduler: admission, the K/V budget, preemption, each round's rows), the cancelled and
the late dropped, a round run, events out to each job (serve.job). What a client gets:

- a job whose client left, or that ran past --request-timeout, is dropped wherever it is
  (waiting, prefilling, decoding) before the next round, its lanes free for that round: one
  that started ends with what it generated (finish_reason "abort"), one still waiting that
  timed out gets a 503;
- a round that fails as a whole (the plan, a shared forward) is logged with an id and its
  requests run again from their committed tokens (decode.scheduler's recover: every lane is
  released, nothing was committed); one whose second round fails gets a 500 (serve.errors.internal:
  the id, no exception text); a request's own failure, or its finish raising, fails that request
  alone; the loop goes on;
- after stop(): waiting requests get 503, running ones finish until the shutdown timeout and
  then end with finish_reason "abort".
Anything that escapes serve() is the watchdog's (serve.worker).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable

from ..errors import SpecdecError
from .errors import ApiError, internal
from .job import Decode, Failed, Finished, JobQueue
from .respond import usage
from .response_format import grammar_rules


class Rounds:
    def __init__(self, scheduler, jobs: JobQueue, loaded, tokenizer_lock: threading.Lock, limits):
        """`scheduler`: a decode.scheduler.Scheduler (its on_start is set here); `loaded`,
        `limits`: serve.worker's Loaded and Limits."""
        self.scheduler, self.jobs, self.loaded, self.limits = scheduler, jobs, loaded, limits
        self.metrics, self.name = jobs.metrics, jobs.name
        self.tokenizer_lock = tokenizer_lock
        self.mean_s = 1.0  # moving average of a request's decode time, for Retry-After
        self._stopping = threading.Event()
        self._abort_at = math.inf
        scheduler.on_start = self._started

    def stop(self, timeout: float) -> None:
        """From any thread: admission ends now, running requests end within `timeout` seconds."""
        if not self._stopping.is_set():
            self._abort_at = time.monotonic() + timeout
            self._stopping.set()
        self.jobs.wake()

    def serve(self) -> None:
        """Take jobs, drop the cancelled and the late, run a round; until a stop has let the
        running requests finish (or its timeout ended them)."""
        s = self.scheduler
        while True:
            self._take(block=s.idle and not self._stopping.is_set())
            if self._stopping.is_set():
                self._refuse_unstarted()
                if s.idle:
                    return
                if time.monotonic() >= self._abort_at:
                    self._abort()
                    return
            self._sweep()
            if not s.idle:
                self._round()

    def fail_everyone(self, error: ApiError) -> None:
        """Answer every request still here with `error` (the worker died)."""
        for request in self.scheduler.drain():
            if request.decoding is None:
                self.jobs.left()
                request.tag.job.put(Failed(error))
            else:
                request.tag.fail(error)

    def _take(self, block: bool) -> None:
        """Jobs from the HTTP side into the scheduler's queue (waiting for one if `block`)."""
        from ..decode.sampling import SamplingConfig
        from ..decode.sequence import Options

        while True:
            job = self.jobs.take(block)
            if job is None and not block:
                return
            block = False
            if job is None:  # a wake-up
                continue
            if self._stopping.is_set():
                self.jobs.left()
                job.put(Failed(_stopping()))
                continue
            g, p = job.generation, job.generation.sampling
            decode = Decode(job, self.name, self.metrics, self.loaded.tokenizer, self.tokenizer_lock)
            try:  # the grammar's rule reads the tokenizer (once per server: ~1 s on 151,936 ids)
                with self.tokenizer_lock:
                    grammar = grammar_rules(g.grammar, self.loaded.tokenizer, self.loaded.lm, len(g.prompt_ids))
            except SpecdecError as e:  # a tokenizer the grammar library cannot read
                self.jobs.left()
                job.put(Failed(ApiError(400, str(e), "response_format", "unsupported_grammar")))
                continue
            options = Options(g.max_tokens, SamplingConfig(p.temperature, p.top_k, p.top_p, p.min_p), p.seed,
                              [] if g.ignore_eos else None, decode.on_commit, decode.on_target_logits,
                              rules=g.penalties.rules(len(g.prompt_ids), self.loaded.lm.vocab_size) + grammar)
            self.scheduler.add(list(g.prompt_ids), options, decode)

    def _started(self, request, alone: bool) -> None:
        self.jobs.left()
        request.tag.start()

    def _sweep(self) -> None:
        """Drop every request whose client left or whose --request-timeout passed."""
        now, s = time.perf_counter(), self.scheduler
        for request in [*s.waiting, *s.active.values()]:
            job = request.tag.job
            late = job.deadline is not None and now >= job.deadline
            if (job.cancelled or late) and s.cancel(request):
                self._gone(request, None if job.cancelled else ApiError(
                    503, f"the request waited past --request-timeout ({self.limits.request_timeout:g} s) without "
                         "starting: the server is busy, retry later", code="timeout", headers={"Retry-After": "5"}))

    def _gone(self, request, unstarted: ApiError | None) -> None:
        """A request dropped before its end: one that started ends with what it generated
        (finish_reason "abort"); one still waiting is answered `unstarted` (None: cancelled)."""
        decode = request.tag
        if request.decoding is not None:
            self._ended(decode, lambda: decode.finish(request.decoding.result("stopped"), self.loaded.method,
                                                      request.cached))
            return
        self.jobs.left()
        if unstarted is not None:
            decode.job.put(Failed(unstarted))
        else:
            self.metrics.ended("cancelled", 0, 0, None)
            decode.job.put(Finished("", "cancelled", usage(0, 0), {}))

    def _round(self) -> None:
        s = self.scheduler
        try:
            ended = s.step()
        except Exception as e:  # noqa: BLE001 - a round failed as a whole: its requests run again
            error = internal(e, "a decode round failed")
            for gone in s.recover(e):
                gone.request.tag.fail(error)
            return
        for gone in ended:
            decode = gone.request.tag
            if gone.error is not None:
                decode.fail(_error(gone.error, gone.request.decoding is None))
            else:
                self._ended(decode, lambda: decode.finish(gone.result, self.loaded.method, gone.request.cached))

    def _ended(self, decode: Decode, finish: Callable[[], float]) -> None:
        try:
            seconds = finish()
        except Exception as e:  # noqa: BLE001 - this request fails, the others go on
            decode.fail(internal(e, "finishing the request failed"))
            return
        self.mean_s = 0.8 * self.mean_s + 0.2 * seconds

    def _refuse_unstarted(self) -> None:
        s = self.scheduler
        for request in [r for r in s.waiting if r.decoding is None]:
            s.cancel(request)
            self._gone(request, _stopping())

    def _abort(self) -> None:
        left = self.scheduler.drain()
        print(f"[specdec] stopping: {len(left)} requests still decoding after --shutdown-timeout "
              f"({self.limits.shutdown_timeout:g} s) end now (finish_reason abort)", file=sys.stderr, flush=True)
        for request in left:
            self._gone(request, _stopping())


def _stopping() -> ApiError:
    return ApiError(503, "the server is stopping: send the request to another server", code="stopping")


def _error(e: Exception, before_start: bool) -> ApiError:
    """A request's own failure: the prompt's checks (before it started) are the client's 400;
    anything later is the server's or the model's (non-finite logits), a 500."""
    if before_start and isinstance(e, SpecdecError):
        return ApiError(400, f"decoding failed: {e}", code="decode_failed")
    return internal(e, "decoding failed")
