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

A request for n choices is n scheduler requests (choice i sampling with seed + i). With the
prefix cache, choice 0 starts alone and the others are held back until it has forwarded the
prompt (its first token committed): then their lanes start from its lane (or the entry it left)
through the prefix cache (runtime.native.prefix_cache: a copy of its K/V, or read in place), all
the prompt but its last token, which each forwards for its own first row; so the prompt is
computed once, not n times. Without the cache all n start at once, each forwarding the prompt. A cancelled request drops all its choices, held or running.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable

from ..errors import SpecdecError
from .errors import ApiError, internal
from .job import Decode, Failed, Finished, Job, JobQueue
from .request import choice_seed
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
        # a request's choice 0 (its scheduler Request) -> its other choices' (prompt, options,
        # Decode), added once it has forwarded the prompt
        self._held: dict[object, list[tuple]] = {}
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
            self._take(block=s.idle and not self._held and not self._stopping.is_set())
            if self._stopping.is_set():
                self._refuse_unstarted()
                if s.idle and not self._held:
                    return
                if time.monotonic() >= self._abort_at:
                    self._abort()
                    return
            self._sweep()
            self._follow()
            if not s.idle:
                self._round()

    def fail_everyone(self, error: ApiError) -> None:
        """Answer every request still here with `error` (the worker died)."""
        for request in self.scheduler.drain():
            if request.decoding is None:
                self._left(request.tag)
                request.tag.job.put(Failed(error))
            else:
                request.tag.fail(error)
        self._drop_held()

    def _take(self, block: bool) -> None:
        """Jobs from the HTTP side into the scheduler's queue (waiting for one if `block`)."""
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
            try:  # the grammar's rule reads the tokenizer (once per server: ~1 s on 151,936 ids)
                first, *others = [self._choice(job, i) for i in range(job.generation.n)]
            except SpecdecError as e:  # a tokenizer the grammar library cannot read
                self.jobs.left()
                job.put(Failed(ApiError(400, str(e), "response_format", "unsupported_grammar")))
                continue
            request = self.scheduler.add(*first)
            if others and self.scheduler.prefix_cache:
                self._held[request] = others  # they start once it has forwarded the prompt (_follow)
            else:
                for choice in others:
                    self.scheduler.add(*choice)

    def _choice(self, job: Job, index: int) -> tuple[list[int], object, Decode]:
        """What the scheduler takes for one choice of `job`: its prompt, its Options (its own
        seed, and rules of its own: a rule may keep state) and its Decode."""
        from ..decode.sampling import SamplingConfig
        from ..decode.sequence import Options

        g, p = job.generation, job.generation.sampling
        decode = Decode(job, self.name, self.metrics, self.loaded.tokenizer, self.tokenizer_lock, index)
        with self.tokenizer_lock:
            grammar = grammar_rules(g.grammar, self.loaded.tokenizer, self.loaded.lm, len(g.prompt_ids))
        options = Options(g.max_tokens, SamplingConfig(p.temperature, p.top_k, p.top_p, p.min_p),
                          choice_seed(p.seed, index), [] if g.ignore_eos else None, decode.on_commit,
                          decode.on_target_logits,
                          rules=g.penalties.rules(len(g.prompt_ids), self.loaded.lm.vocab_size) + grammar)
        return list(g.prompt_ids), options, decode

    def _follow(self) -> None:
        """Add the held choices of every request whose choice 0 has forwarded the prompt (its
        first token committed): their lanes start from its lane, or from the entry it left, through
        the prefix cache. Those of a request that ended otherwise (cancelled, refused, failed
        before its first token) end as cancelled: its client has its answer or is gone."""
        s = self.scheduler
        for request, others in list(self._held.items()):
            first = request.tag
            if first.first_at is not None and not first.failed and not first.job.cancelled:
                for choice in others:
                    s.add(*choice)
            elif not first.job.cancelled and (request in s.waiting or request.decoding in s.active):
                continue  # still on its way to its first token
            else:
                self._cancel_held(others)
            del self._held[request]

    def _drop_held(self) -> None:
        """End every held choice as cancelled (the server is stopping, or the worker died)."""
        for others in self._held.values():
            self._cancel_held(others)
        self._held.clear()

    def _cancel_held(self, choices: list[tuple]) -> None:
        for _, _, decode in choices:
            self.metrics.ended("cancelled", 0, 0, None)
            decode.job.put(Finished("", "cancelled", usage(0, 0), {}, decode.index))

    def _started(self, request, alone: bool) -> None:
        self._left(request.tag)
        request.tag.start()

    def _left(self, decode: Decode) -> None:
        """A request left the job queue: its choice 0 started, or was refused or cancelled
        before it did (the queue counts a request once, whatever its n)."""
        if decode.index == 0:
            self.jobs.left()

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
        self._left(decode)
        if unstarted is not None:
            decode.job.put(Failed(unstarted))
        else:
            self.metrics.ended("cancelled", 0, 0, None)
            decode.job.put(Finished("", "cancelled", usage(0, 0), {}, decode.index))

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
        """Refuse the requests that have not started; the other choices of one that has go on."""
        s = self.scheduler
        for request in [r for r in s.waiting if r.decoding is None and (r.tag.index == 0 or r.tag.job.cancelled)]:
            s.cancel(request)
            self._gone(request, _stopping())

    def _abort(self) -> None:
        left = self.scheduler.drain()
        print(f"[specdec] stopping: {len(left)} requests still decoding after --shutdown-timeout "
              f"({self.limits.shutdown_timeout:g} s) end now (finish_reason abort)", file=sys.stderr, flush=True)
        for request in left:
            self._gone(request, _stopping())
        self._drop_held()


def _stopping() -> ApiError:
    return ApiError(503, "the server is stopping: send the request to another server", code="stopping")


def _error(e: Exception, before_start: bool) -> ApiError:
    """A request's own failure: the prompt's checks (before it started) are the client's 400;
    anything later is the server's or the model's (non-finite logits), a 500."""
    if before_start and isinstance(e, SpecdecError):
        return ApiError(400, f"decoding failed: {e}", code="decode_failed")
    return internal(e, "decoding failed")
