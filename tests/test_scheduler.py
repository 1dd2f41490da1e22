"""The decode scheduler (decode.scheduler) driven directly, without a server, on tiny native
models: admission within --max-sequences and the K/V budget, a request that does not fit passed
over rather than blocking, preemption of the request that asked for the most and its bit-exact
resumption, cancellation at every stage with its lanes freed at once, the plan's k, and a round
that fails as a whole. Greedy outputs are compared with each prompt generated alone, token for
token."""

from __future__ import annotations

import pytest
from test_runtime import native_pair, sequence

from specdec import DraftModel, generate
from specdec.decode.scheduler import Scheduler
from specdec.decode.sequence import Options
from specdec.errors import SpecdecError


@pytest.fixture(scope="module")
def models():
    return native_pair()


def _alone(target, drafter, prompt, tokens, **kw) -> list[int]:
    return generate(target, prompt, drafter=drafter, max_new_tokens=tokens, eos_token_id=[], **kw).new_tokens


def _run(scheduler: Scheduler, limit: int = 2000) -> dict:
    """Step until idle: each request's result, checking every round that the claims made for
    it fit the budget, and after it that the target's caches hold no more positions than the
    budget, nor more sequences than the limit."""
    results = {}
    for _ in range(limit):
        if scheduler.idle:
            return results
        ended = scheduler.admit()
        if scheduler.kv_tokens is not None:
            assert scheduler.held() <= scheduler.kv_tokens
        ended += scheduler.round()
        for gone in ended:
            assert gone.error is None, gone.error
            results[gone.request.order] = gone.result
        if scheduler.kv_tokens is not None:
            assert sum(d.lm.length for d in scheduler.active) <= scheduler.kv_tokens
        if scheduler.sequences is not None:
            assert len(scheduler.active) <= scheduler.sequences
    raise AssertionError("the scheduler did not finish")


@pytest.mark.parametrize("method", ["plain", "draft"])
def test_requests_decode_as_alone_within_the_sequence_limit_and_budget(models, method):
    """Five requests, at most two at a time, within 96 K/V positions claimed in chunks of 16:
    every output equals its prompt alone, and no round held more than the limits allow."""
    target, draft = models
    drafter = DraftModel(draft, k=3) if method == "draft" else None
    prompts = [sequence(5 + 6 * i, seed=40 + i) for i in range(5)]
    want = [_alone(target, drafter, p, 20 + 3 * i) for i, p in enumerate(prompts)]
    held = target.pool.held()
    scheduler = Scheduler(target, drafter, sequences=2, kv_tokens=96, kv_chunk=16)
    requests = [scheduler.add(p, Options(20 + 3 * i, eos_token_id=[])) for i, p in enumerate(prompts)]
    results = _run(scheduler)
    assert [results[r.order].new_tokens for r in requests] == want
    assert target.pool.held() == held


def test_a_request_larger_than_the_budget_is_refused_when_added(models):
    target, _ = models
    scheduler = Scheduler(target, kv_tokens=64, kv_chunk=16)
    assert scheduler.room_error(10, 54) is None  # 10 + 54 = 64 positions: whole chunks of 16
    assert "need 80 K/V positions" in scheduler.room_error(10, 55)
    with pytest.raises(SpecdecError, match="more than the server's whole budget of 64"):
        scheduler.add(sequence(10), Options(55, eos_token_id=[]))
    assert scheduler.idle


def test_a_request_that_does_not_fit_yet_is_passed_over_not_blocking_the_ones_behind(models):
    """A long request runs; the next in line needs more room than is left (and asked for more
    than the running one, so it may not preempt it), so it waits, and the short one behind it
    starts in the same step; the long one, had it asked for more, would have been preempted."""
    target, _ = models
    scheduler = Scheduler(target, kv_tokens=128, kv_chunk=16)
    first = scheduler.add(sequence(60, seed=1), Options(20, eos_token_id=[]))
    scheduler.step()
    big = scheduler.add(sequence(70, seed=2), Options(20, eos_token_id=[]))
    small = scheduler.add(sequence(8, seed=3), Options(10, eos_token_id=[]))
    scheduler.step()
    assert small.decoding is not None and small.decoding.new >= 1
    assert big.decoding is None and scheduler.waiting == [big]
    _run(scheduler)
    assert first.decoding.new == 20 and big.decoding.new == 20 and first.preempted == big.preempted == 0
    scheduler = Scheduler(target, kv_tokens=128, kv_chunk=16)
    first = scheduler.add(sequence(60, seed=1), Options(30, eos_token_id=[]))
    scheduler.step()
    big = scheduler.add(sequence(70, seed=2), Options(10, eos_token_id=[]))
    scheduler.step()
    assert first.preempted == 1 and big.decoding.new >= 1 and scheduler.waiting == [first]
    _run(scheduler)
    assert first.decoding.new == 30 and big.decoding.new == 10


@pytest.mark.parametrize("sampled", [False, True])
def test_a_long_request_is_preempted_for_short_ones_and_resumes_bit_for_bit(models, sampled):
    """A request asking for 150 tokens beside short ones arriving every few rounds, in a budget
    that cannot hold them all once it has grown: it is preempted (the one that asked for the
    most), resumes from its committed tokens, and every output (greedy; sampled: the same seed)
    equals its prompt alone. Each short request's first token comes within 3 steps of its
    arrival; every committed token reached on_commit once."""
    target, draft = models
    drafter = DraftModel(draft, k=3)
    kw = dict(temperature=0.8, seed=5) if sampled else {}
    long_prompt, shorts = sequence(20, seed=50), [sequence(12, seed=51 + i) for i in range(6)]
    want_long = _alone(target, drafter, long_prompt, 150, **kw)
    want_short = [_alone(target, drafter, p, 12, **kw) for p in shorts]
    committed: dict[int, list[int]] = {}
    preempted = []

    def options(tokens: int, key: int) -> Options:
        on_commit = lambda got, _: committed.setdefault(key, []).extend(got) and False
        return Options(tokens, eos_token_id=[], on_commit=on_commit,
                       **({"seed": 5, "sampling": _sampling(0.8)} if sampled else {}))

    # The long request may claim 20 + 150 -> 176 positions; grown past 144 it leaves no room for
    # a short one's 12 + 1 + 3 -> 16.
    scheduler = Scheduler(target, drafter, kv_tokens=176, kv_chunk=16, on_preempt=preempted.append)
    long = scheduler.add(long_prompt, options(150, -1))
    results, arrivals, first_at = {}, {}, {}
    when = [20, 60, 120, 126, 132, 138]  # the long one's tokens at which a short one arrives
    for step in range(3000):
        grown = long.decoding.new if long.decoding is not None else 0
        if len(arrivals) < len(shorts) and (grown >= when[len(arrivals)] or long in scheduler.waiting):
            i = len(arrivals)
            arrivals[i] = (scheduler.add(shorts[i], options(12, i)), step)
        for ended in scheduler.admit():
            results[ended.request.order] = ended.result
        assert scheduler.held() <= 176
        for ended in scheduler.round():
            assert ended.error is None
            results[ended.request.order] = ended.result
        for i, (request, at) in arrivals.items():
            if i not in first_at and request.decoding is not None and request.decoding.new:
                first_at[i] = step - at
        if scheduler.idle and len(arrivals) == len(shorts):
            break
    assert preempted and all(r is long for r in preempted)
    assert results[long.order].new_tokens == want_long == committed[-1]
    assert [results[r.order].new_tokens for r, _ in arrivals.values()] == want_short
    assert [committed[i] for i in range(len(shorts))] == want_short
    assert max(first_at.values()) <= 2, first_at


def _sampling(temperature: float):
    from specdec.decode.sampling import SamplingConfig

    return SamplingConfig(temperature)


def test_cancel_frees_a_request_at_every_stage(models):
    """Cancelled while waiting (never starts), while its prompt is forwarded in chunks inside
    another's rounds, and while decoding: each leaves at once, its lanes freed before the next
    round, and the request that goes on is unchanged."""
    target, draft = models
    drafter = DraftModel(draft, k=3)
    plan = lambda running, most, riding: [min(1, m) for m in most]
    keep = sequence(9, seed=60)
    want = _alone(target, drafter, keep, 40)
    held = target.pool.held(), draft.pool.held()
    scheduler = Scheduler(target, drafter, plan, round_rows=16, sequences=2)
    kept = scheduler.add(keep, Options(40, eos_token_id=[]))
    scheduler.step()
    joiner = scheduler.add(sequence(90, seed=61), Options(20, eos_token_id=[]))
    waiter = scheduler.add(sequence(10, seed=62), Options(20, eos_token_id=[]))
    scheduler.step()
    assert 0 < joiner.decoding.lm.length < 90 and joiner.decoding in scheduler.batch.joining
    assert waiter.decoding is None  # two at a time
    assert scheduler.cancel(waiter) and scheduler.waiting == []
    assert scheduler.cancel(joiner) and joiner.decoding.lm.length == 0 and not scheduler.batch.joining
    assert not scheduler.cancel(joiner)  # already gone
    decoder = scheduler.add(sequence(7, seed=63), Options(30, eos_token_id=[]))
    scheduler.step()
    scheduler.step()
    assert decoder.decoding.new > 1
    assert scheduler.cancel(decoder) and decoder.decoding.lm.length == 0
    assert decoder.decoding.draft_lm.length == 0
    assert list(scheduler.active.values()) == [kept]
    results = _run(scheduler)
    assert results[kept.order].new_tokens == want
    assert (target.pool.held(), draft.pool.held()) == held


def test_the_plan_decides_each_rounds_guesses(models):
    """A plan that keeps every request plain: no draft call after the prompt's first token, the
    outputs those of plain decoding; one that guesses: the requests speculate."""
    target, draft = models
    prompts = [sequence(8 + i, seed=70 + i) for i in range(3)]
    want = [_alone(target, None, p, 16) for p in prompts]
    for plan, guessed in ((lambda running, most, riding: [0] * len(most), False), (None, True)):
        scheduler = Scheduler(target, DraftModel(draft, k=3), plan, sequences=3)
        requests = [scheduler.add(p, Options(16, eos_token_id=[])) for p in prompts]
        results = _run(scheduler)
        assert [results[r.order].new_tokens for r in requests] == want
        assert all((results[r.order].stats.proposed > 0) == guessed for r in requests)


def test_a_round_that_fails_as_a_whole_runs_its_requests_again_and_ends_them_on_a_second_failure(models,
                                                                                                monkeypatch):
    """The batch's round raises once: every active request's lanes are freed and it runs again
    from its committed tokens, its output that of the prompt alone; a round that keeps failing
    ends each request with the error at its second failed round, its lanes freed."""
    from specdec.decode.batch import Batch

    target, draft = models
    drafter = DraftModel(draft, k=3)
    prompts = [sequence(6 + i, seed=80 + i) for i in range(3)]
    want = [_alone(target, drafter, p, 20) for p in prompts]
    held = target.pool.held(), draft.pool.held()
    scheduler = Scheduler(target, drafter, sequences=2)
    requests = [scheduler.add(p, Options(20, eos_token_id=[])) for p in prompts]
    scheduler.step()
    scheduler.step()
    step, calls = Batch.step, []
    monkeypatch.setattr(Batch, "step", lambda self: 1 / 0 if not calls and not calls.append(1) else step(self))
    with pytest.raises(ZeroDivisionError):
        scheduler.step()
    assert scheduler.recover(ZeroDivisionError()) == [] and not scheduler.active
    assert scheduler.waiting == requests and (target.pool.held(), draft.pool.held()) == held
    results = _run(scheduler)
    assert [results[r.order].new_tokens for r in requests] == want
    monkeypatch.setattr(Batch, "step", lambda self: 1 / 0)
    again = [scheduler.add(p, Options(20, eos_token_id=[])) for p in prompts[:2]]
    ended = []
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            scheduler.step()
        ended += scheduler.recover(RuntimeError("round"))
    assert [e.request for e in ended] == again and all(isinstance(e.error, RuntimeError) for e in ended)
    assert scheduler.idle and (target.pool.held(), draft.pool.held()) == held


def test_the_arrivals_measurement_drives_the_scheduler_as_it_is(models):
    """scripts/measure/batch_arrivals.py's wave on the tiny pair (no subclass: the scheduler's
    on_start hook and its admit/round halves): every request makes its tokens, and the eager
    variant has a lone request's draft read its whole prompt before its first round."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts/measure/batch_arrivals.py"
    spec = importlib.util.spec_from_file_location("batch_arrivals", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    target, draft = models
    plan = lambda running, most, riding: [0] * len(most)  # plain rounds: the draft reads only what it must
    prompts = [sequence(10 + i, seed=90 + i).tolist() for i in range(3)]
    for eager in (False, True):
        scheduler = Scheduler(target, DraftModel(draft, k=3), plan, round_rows=16)
        requests, add = [], scheduler.add
        scheduler.add = lambda *args: requests.append(add(*args)) or requests[-1]
        rate, stall = script._wave(scheduler, prompts, [0.0, 0.0, 0.0], 12, eager)
        assert rate > 0 and stall >= 0 and scheduler.idle
        assert [r.decoding.new for r in requests] == [12, 12, 12]
        # the draft's forwards: the prompt's first token, and (eager, the lone first request) the rest
        assert [r.decoding.drafter.calls for r in requests] == [2 if eager else 1, 1, 1]
