"""The decode worker: one thread that loads the models, owns them, and runs the decode scheduler
(decode.scheduler: admission, the K/V budget, preemption, the rows of each round) in its loop
(serve.rounds) over the jobs the HTTP side submits (serve.job). This module is the thread's
life and the HTTP side's calls:

- submit: a request larger than the whole K/V budget (its n choices together) is a 400 at once
  (check_fits); more than --max-queue waiting is a 503 with Retry-After; the worker never blocks
  on a client (Job.put only schedules an event on the client's loop).
- the watchdog: anything that escapes the loop (a bug outside every request's own error
  handling) leaves /health answering 503 with the reason, every queued and running request a
  500 at once, and `on_death` stopping the server, which exits non-zero so that a supervisor
  restarts a clean process (restarting the thread in place would reuse caches a fault left in
  an unknown state).
- stop (SIGTERM): admission ends (503), waiting requests are refused, running ones get
  --shutdown-timeout seconds to finish and then end with finish_reason "abort".
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SpecdecError
from .errors import ApiError, internal
from .job import Job, JobQueue
from .metrics import ServerMetrics
from .request import Defaults, Generation, Model
from .tools import Tools, ToolUse, call_format

WARMUP_TOKENS = 4
# Rows a round's target forward is filled up to with joining prompts (Limits.round_rows). On
# the Zen 4 at 8 clients arriving ~1 s apart, 64 rows cut a running stream's longest stall from
# 2.6 s (p99 5.6) with prompts prefilled alone to 0.4 s (p99 0.6), for 0.98x the tokens in all
# and first tokens 0.4 s later; 16 rows stalled 0.14 s but cost 0.93x and 1 s (docs/serving.md,
# "Chunked prefill").
ROUND_ROWS = 64
SHUTDOWN_S = 30.0


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
    """How many requests decode at once and how many K/V positions they may hold together
    (claimed as they grow: decode.scheduler); the rows a round's target forward is filled up to
    with arriving prompts (0: each prefilled alone, the rounds waiting); the seconds a request
    may take from its arrival (None: no limit) and a shutdown waits for running requests; whether
    ended requests' K/V stay cached for later prompts that share a prefix (within kv_tokens)."""

    sequences: int = 8
    kv_tokens: int = 32768
    round_rows: int = ROUND_ROWS
    request_timeout: float | None = None
    shutdown_timeout: float = SHUTDOWN_S
    prefix_cache: bool = True


class DecodeWorker:
    def __init__(self, load: Callable[[], Loaded], metrics: ServerMetrics, name: str, defaults: Defaults,
                 max_queue: int, on_load_failure: Callable[[BaseException], None] | None = None,
                 limits: Limits = Limits(), on_death: Callable[[str], None] | None = None):
        self.metrics, self.name, self.defaults, self.limits = metrics, name, defaults, limits
        # "loading", then "ready", "stopping", "stopped"; or "failed" (load_error says why) or
        # "dead" (the worker thread died: death says why)
        self.state = "loading"
        self.load_error: BaseException | None = None
        self.death: str | None = None
        self.loaded: Loaded | None = None
        self.model: Model | None = None
        self.scheduler = None  # decode.scheduler.Scheduler, once the models are loaded
        self.tokenizer_lock = threading.Lock()
        self._load, self.on_load_failure, self.on_death = load, on_load_failure, on_death
        self.jobs = JobQueue(max_queue, metrics, name)
        self._lock = threading.Lock()  # state changes against submit
        self._rounds = None  # serve.rounds.Rounds, once loaded
        self._stop_asked = False
        self._thread = threading.Thread(target=self._run, name="specdec-decode", daemon=True)

    # --- the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def check_fits(self, generation: Generation) -> None:
        """A 400 for a request that could never run, its prompt and max_tokens past the whole
        K/V budget (before it queues), or whose n choices could not all be held at once: with the
        prefix cache the prompt once and each answer (the later choices read choice 0's prompt in
        place and forward its last token), else each choice with a prompt of its own."""
        s, g = self.scheduler, generation
        if s is None:
            return
        error, param = s.room_error(len(g.prompt_ids), g.max_tokens), "max_tokens"
        whole = s.budget.rounded(len(g.prompt_ids) + g.max_tokens)
        need = whole + (g.n - 1) * (s.budget.rounded(1 + g.max_tokens) if s.prefix_cache else whole)
        if error is None and g.n > 1 and s.kv_tokens is not None and need > s.kv_tokens:
            error, param = (f"n={g.n} choices of the prompt ({len(g.prompt_ids)} tokens) and max_tokens "
                            f"({g.max_tokens}) need {need} K/V positions together, more than the server's whole "
                            f"budget of {s.kv_tokens} (--kv-tokens): lower n or max_tokens"), "n"
        if error is not None:
            self.metrics.reject("too_large")
            raise ApiError(400, error, param, "kv_budget_exceeded")

    def submit(self, job: Job) -> None:
        self.check_fits(job.generation)
        with self._lock:
            if self.state != "ready":
                raise self.not_ready()
            if self.limits.request_timeout is not None:
                job.deadline = job.arrived + self.limits.request_timeout
            self.jobs.put(job, self._rounds.mean_s if self._rounds else 1.0)

    def not_ready(self) -> ApiError:
        if self.state == "loading":
            return ApiError(503, "the model is loading: retry once GET /health answers 200", code="loading",
                            headers={"Retry-After": "5"})
        if self.state == "failed":
            return ApiError(503, f"the model failed to load: {self.load_error}", code="load_failed")
        if self.state == "dead":
            return ApiError(503, f"the decode worker died ({self.death}); the server is exiting: restart it",
                            code="worker_dead")
        return ApiError(503, "the server is stopping: send the request to another server", code="stopping")

    def encode_text(self, text: str) -> list[int]:
        from ..prompts.chat import encode_prompt

        with self.tokenizer_lock:
            return encode_prompt(self.loaded.tokenizer, text, raw=True)

    def encode_chat(self, messages: list[dict], tools: Tools | None = None) -> tuple[list[int], ToolUse | None]:
        """The chat prompt's ids and, with tools, how this model takes them (a 400 where its
        template cannot)."""
        from ..prompts.chat import encode_messages

        tokenizer = self.loaded.tokenizer
        use = None
        try:
            with self.tokenizer_lock:
                if tools is not None:
                    form = call_format(tokenizer.chat_template)
                    tags = tokenizer.get_added_vocab()  # a tag that is one token: {text: id}
                    use = ToolUse(tools, form, tags.get(form.open), tags.get(form.close))
                ids = encode_messages(tokenizer, messages, list(tools.tools) if tools else None,
                                      use.head if use else "")
        except ApiError:  # the template takes no tools
            raise
        except SpecdecError as e:
            raise ApiError(400, str(e), "messages", "unsupported_messages") from None
        except Exception as e:  # a template's own error (e.g. a role it does not take)
            raise ApiError(400, f"the model's chat template refused these messages: {e}", "messages",
                           "chat_template_error") from None
        return ids, use

    def stop(self) -> None:
        """Stop admitting (503); waiting requests are refused now, running ones get
        --shutdown-timeout seconds to finish. Idempotent."""
        with self._lock:
            self._stop_asked = True
            if self.state == "ready":
                self.state = "stopping"
        self.jobs.refuse_all(ApiError(503, "the server is stopping", code="stopping"))
        if self._rounds is not None:
            self._rounds.stop(self.limits.shutdown_timeout)  # wakes the worker (after refuse_all took the queue)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        from ..decode.scheduler import Scheduler
        from .rounds import Rounds

        try:
            self.loaded = loaded = self._load()
            self.model = Model(self.name, loaded.lm.vocab_size, loaded.lm.max_positions, self.defaults)
            self._warm_up()
            limits = self.limits
            self.scheduler = Scheduler(loaded.lm, loaded.drafter, loaded.plan, limits.round_rows, limits.sequences,
                                       limits.kv_tokens, prefix_cache=limits.prefix_cache)
        except BaseException as e:  # noqa: BLE001 - the server reports it and stops
            self.load_error, self.state = e, "failed"
            if self.on_load_failure:
                self.on_load_failure(e)
            return
        self._rounds = Rounds(self.scheduler, self.jobs, loaded, self.tokenizer_lock, limits)
        with self._lock:
            if self._stop_asked:  # stopped while loading
                self._rounds.stop(0.0)
            else:
                self.state = "ready"
        joining = f"prompts joining in rounds of up to {limits.round_rows} rows" if limits.round_rows else \
            "prompts prefilled alone"
        cache = "a prefix cache" if self.scheduler.prefix_cache else "no prefix cache"
        print(f"[specdec] serving {self.name} ({loaded.method}; up to {limits.sequences} requests at "
              f"once, {limits.kv_tokens} K/V positions, {joining}, {cache})", file=sys.stderr, flush=True)
        try:
            self._rounds.serve()
        except BaseException as e:  # noqa: BLE001 - the watchdog: report, answer everyone, stop the server
            self._died(e)
            return
        retimed = getattr(loaded.plan, "retimed", None)
        if retimed is not None:  # how far serving moved the costs timed at start
            print(f"[specdec] the batch plan's costs while serving, over those timed at start: {retimed()}",
                  file=sys.stderr, flush=True)
        self.state = "stopped"

    def _warm_up(self) -> None:
        """One short greedy generation, so the first request does not pay one-time costs (weight
        packing, kernel selection; the grammar library's vocabulary); then the runtime's own cache
        is given back."""
        from ..decode.engine import generate
        from .response_format import prepare_grammars

        loaded = self.loaded
        prompt = list(range(1, 1 + min(8, loaded.lm.vocab_size - 1)))
        generate(loaded.lm, prompt, drafter=loaded.drafter, max_new_tokens=WARMUP_TOKENS, eos_token_id=[])
        prepare_grammars(loaded.tokenizer, loaded.lm)
        draft_lm = loaded.drafter.draft_lm if loaded.drafter is not None else None
        for lm in (loaded.lm, draft_lm):  # requests decode on lanes of their own
            if lm is not None:
                lm.release()

    def _died(self, e: BaseException) -> None:
        error = internal(e, "the decode worker stopped")
        with self._lock:
            self.state, self.death = "dead", error.message
        self.jobs.refuse_all(error)
        self._rounds.fail_everyone(error)
        if self.on_death is not None:
            self.on_death(error.message)
