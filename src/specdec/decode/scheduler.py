"""Which sequences run each round, and with what K/V: the one owner of admission, the K/V budget,
preemption and cancellation over a decode.batch.Batch (which runs a round: the plan's k per
sequence, the joining prompts' chunks, the shared forwards). A server's worker, generate over
several prompts and the measurement scripts all drive this class, nothing else.

Admission: requests wait in arrival order and start between rounds, up to `sequences` at once,
while the positions they claim fit `kv_tokens`. A request claims K/V as it grows, in chunks of
`kv_chunk` positions (what the round may append: its committed tokens, a round's guesses and
the target's token), not its prompt + max_tokens up front; so a request asking for a long answer
holds only what it has written, and one that does not fit yet is passed over, never holding up
the requests behind it. When the running sequences grow past the budget, the one that asked
for the most (prompt + max_tokens; the later arrival on a tie) is preempted: its lanes are freed
and it waits again in its arrival place; when it fits it resumes (decode.batch.Batch.resume: its
cache recomputed from the committed tokens, bit for bit on the native runtime, where a row's
logits do not depend on the block it is in), and its already-committed tokens are not committed
again. A request larger than the whole budget is refused when added (room_error), so every
admitted request fits alone and the oldest always progresses.

With prefix_cache, ended requests' K/V stay as cached entries a request starts from; they count
within the budget, evicted before anyone is preempted (decode.kv_budget).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from ..errors import SpecdecError
from .batch import Batch, Plan
from .interface import Runtime
from .kv_budget import KVBudget
from .request import Request
from .proposal import Proposer
from .sequence import Decoding, GenerationResult, Options

# Positions a request claims at a time (at most the whole budget); vLLM's blocks are 16. A claim
# is bookkeeping: the runtime's cache grows on its own (runtime.native.slot_pool), so a chunk only sets how
# finely the budget is shared.
KV_CHUNK = 64
FAILURES = 2  # failed rounds a request survives, but the last (Scheduler.recover)


@dataclass(frozen=True)
class Ended:
    """A request that left the scheduler: its result (None when `error` ended it)."""

    request: Request
    result: GenerationResult | None
    error: BaseException | None = None


@dataclass
class Scheduler:
    """The requests on `target` (proposals from forks of `drafter`, k per round from `plan`).
    `round_rows`: decode.batch.Batch's chunked prefill; `sequences`, `kv_tokens`: the limits
    (None: none); `on_start(request, alone)`: told when a request's Decoding is created (alone:
    nothing else ran), before its first token; `on_preempt(request)`: when its lanes are taken.
    `prefix_cache`: lanes start from and end into the runtimes' prefix caches, bounded by
    `kv_tokens` (where the target has one: Runtime.prefixes)."""

    target: Runtime
    drafter: Proposer | None = None
    plan: Plan | None = None
    round_rows: int = 0
    sequences: int | None = None
    kv_tokens: int | None = None
    kv_chunk: int = KV_CHUNK
    on_start: Callable[[Request, bool], None] | None = None
    on_preempt: Callable[[Request], None] | None = None
    prefix_cache: bool = False
    waiting: list[Request] = field(default_factory=list)
    active: dict[Decoding, Request] = field(default_factory=dict)  # started and holding lanes

    def __post_init__(self):
        if self.kv_tokens is not None:
            self.kv_chunk = min(self.kv_chunk, self.kv_tokens)
        elif self.prefix_cache:
            raise ValueError("a prefix cache is bounded by kv_tokens: give both")
        draft_lm = self.drafter.draft_lm if self.drafter is not None else None
        caches = [lm.prefixes for lm in (self.target, draft_lm)
                  if self.prefix_cache and lm is not None and lm.prefixes is not None]
        self.prefix_cache = bool(caches) and caches[0] is self.target.prefixes
        self.budget = KVBudget(self.kv_tokens, self.kv_chunk, self.drafter.k if self.drafter is not None else 0,
                               caches if self.prefix_cache else [])
        self.batch = Batch(self.target, self.drafter, self.plan, self.round_rows, self.prefix_cache)
        self._orders = itertools.count()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def held(self) -> int:
        """K/V positions the active requests claim and the target's cached entries hold together."""
        return self._running() + self.budget.cached()

    def _running(self) -> int:
        return sum(self.budget.claim(r) for r in self.active.values())

    def room_error(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """Why a request of this size can never run here (None: it can, alone at least)."""
        return self.budget.room_error(prompt_tokens, max_new_tokens)

    def add(self, prompt: torch.Tensor | Sequence[int], options: Options, tag: object = None) -> Request:
        """Queue a request (it starts in a later step); SpecdecError if it can never fit."""
        error = self.room_error(len(prompt), options.max_new_tokens)
        if error is not None:
            raise SpecdecError(error)
        request = Request(prompt, options, tag, next(self._orders))
        self.waiting.append(request)
        return request

    def cancel(self, request: Request) -> bool:
        """Drop a request wherever it is (waiting, prefilling, decoding), its lanes freed now;
        False if it had already left."""
        if request in self.waiting:
            self.waiting.remove(request)
            return True
        d = request.decoding
        if d is None or self.active.get(d) is not request:
            return False
        self.batch.remove(d)
        del self.active[d]
        return True

    def step(self) -> list[Ended]:
        """admit, then round: the requests that ended."""
        return self.admit() + self.round()

    def admit(self) -> list[Ended]:
        """Preempt while the running requests' growth overflows the budget, then start the
        waiting requests that fit; those that ended at once (in their prefill)."""
        self._make_room()
        ended: list[Ended] = []
        for request in list(self.waiting):
            if self.sequences is not None and len(self.active) >= self.sequences:
                break
            if not self._fits(request) and not self._preempt_for(request):
                continue  # passed over, not blocking: a later, smaller request may fit
            self.waiting.remove(request)
            ended += self._start(request)
        self.budget.bound_drafts()
        return ended

    def round(self) -> list[Ended]:
        """One round of the active requests; those that ended in it."""
        if not self.batch.sequences:
            return []
        ended = [self._end(d, error) for d, error in self.batch.step()]
        self.budget.bound_drafts()
        return ended

    def recover(self, error: BaseException) -> list[Ended]:
        """After a round that failed as a whole (the plan, a shared forward: nothing was
        committed yet), free every active request's lanes: each runs again from its committed
        tokens (greedy: bit for bit on the native runtime), unless this is its FAILURES-th failed
        round: then it ends with `error` (returned), so a fault that persists cannot loop."""
        ended = []
        for request in list(self.active.values()):
            request.failures += 1
            if request.failures >= FAILURES:
                ended.append(self._end(request.decoding, error, remove=True))
            else:
                self._preempt(request, notify=False)
        self.budget.clear()  # what the failed forward left in the pool is not trusted
        return ended

    def drain(self) -> list[Request]:
        """Every request still here, waiting or active, removed (lanes freed)."""
        left = [*self.active.values(), *self.waiting]
        for d in list(self.active):
            self.batch.remove(d)
        self.active.clear()
        self.waiting.clear()
        return left

    # --- admission and the budget -----------------------------------------------------------

    def _start(self, request: Request) -> list[Ended]:
        """Start a request, or resume a preempted one (its cache recomputed)."""
        d = request.decoding
        if d is None and self.on_start is not None:
            self.on_start(request, not self.batch.sequences)
        try:
            if d is None:
                d = request.decoding = self.batch.add(request.prompt, request.options, self.kv_chunk)
            else:
                self.batch.resume(d)
        except Exception as error:  # noqa: BLE001 - one request fails, the others go on
            return [Ended(request, None, error)]
        if request.cached is None and self.prefix_cache:
            request.cached = d.cached
        if d not in self.batch.sequences:  # it ended with its first token
            return [Ended(request, d.result())]
        self.active[d] = request
        return []

    def _make_room(self) -> None:
        """Preempt the request that asked for the most while the round's growth overflows."""
        if self.kv_tokens is None:
            return
        self.budget.evict(self.held() - self.kv_tokens)
        while self.held() > self.kv_tokens and len(self.active) > 1:
            self._preempt(max(self.active.values(), key=_weight))
            self.budget.evict(self.held() - self.kv_tokens)

    def _fits(self, request: Request) -> bool:
        """Whether `request` fits, cached entries evicted for it where that suffices."""
        if self.kv_tokens is None or self.held() + self.budget.claim(request) <= self.kv_tokens:
            return True
        if not self.prefix_cache:
            return False
        if self._running() + self.budget.claim(request) + self.budget.pinned(request) <= self.kv_tokens:
            self.budget.evict_for(request, self._running())
            return True
        # Reading a prefix in place pins its whole entry, which may leave no room beside it (with
        # nothing running, the request then waited forever): started cold where that fits, the
        # entries no live lane reads evicted.
        if self._running() + self.budget.claim(request, cold=True) + self.budget.pinned() <= self.kv_tokens:
            self.budget.evict(self.budget.cached())
            return True
        return False

    def _preempt_for(self, request: Request) -> bool:
        """Preempt active requests that asked for more than `request`, the most first, if that
        frees room for it (only larger ones: a request never displaces a smaller or equal one,
        so two requests cannot take turns preempting each other); cached entries count as free
        room (evicted as needed)."""
        running = self._running() + self.budget.pinned(request) if self.prefix_cache else self.held()
        free, freed = self.kv_tokens - running, []
        for other in sorted((r for r in self.active.values() if _weight(r) > _weight(request)), key=_weight,
                            reverse=True):
            if free >= self.budget.claim(request):
                break
            free += self.budget.claim(other)
            freed.append(other)
        if free < self.budget.claim(request):
            return False
        for other in freed:
            self._preempt(other)
        if self.prefix_cache:
            self.budget.evict_for(request, self._running())
        return True

    def _preempt(self, request: Request, notify: bool = True) -> None:
        """Free `request`'s lanes; it waits again in its arrival place, its tokens kept."""
        self.batch.remove(request.decoding)
        del self.active[request.decoding]
        bisect.insort(self.waiting, request, key=lambda r: r.order)
        if notify:
            request.preempted += 1
            if self.on_preempt is not None:
                self.on_preempt(request)

    def _end(self, d: Decoding, error: BaseException | None, remove: bool = False) -> Ended:
        request = self.active.pop(d)
        if remove:
            self.batch.remove(d)
        return Ended(request, None if error is not None else d.result(), error)


def _weight(request: Request) -> tuple[int, int]:
    """What preemption weighs: the positions asked for, then the later arrival."""
    return request.asked, request.order


def decode_together(target: Runtime, prompts: Sequence[torch.Tensor | Sequence[int]], drafter: Proposer | None,
                   options: Options, plan: Plan | None = None) -> list[GenerationResult]:
    """engine.generate over several prompts decoded together: the results in the prompts' order,
    each the same as that prompt generated alone (greedy: the same tokens, bit for bit on the
    native runtime; sampling: the same distribution, prompt i drawing from seed + i)."""
    if options.on_commit or options.on_target_logits:
        raise SpecdecError("on_commit and on_target_logits take one prompt: generate the prompts one by one, "
                           "or run a decode.scheduler.Scheduler with options per request")
    scheduler = Scheduler(target, drafter, plan)
    requests = [scheduler.add(prompt, options if options.seed is None else replace(options, seed=options.seed + i))
                for i, prompt in enumerate(prompts)]
    results: dict[int, GenerationResult] = {}
    try:
        while not scheduler.idle:
            for ended in scheduler.step():
                if ended.error is not None:
                    raise ended.error
                results[ended.request.order] = ended.result
    finally:
        scheduler.drain()
    return [results[r.order] for r in requests]
