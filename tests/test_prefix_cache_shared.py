"""Lanes that read one cached prefix in place (runtime.native.prefix_cache), on tiny native
models: their rows have the bits of a lane that forwarded everything (torch.equal), two and
four live requests over one prefix keep its slots once and decode as cold starts (greedy and
seeded sampling), an entry a live lane reads is never evicted and its last reader frees it, and
the K/V budget counts the shared slots once (four requests run at once in a budget that copies
would overflow)."""

from __future__ import annotations

import pytest
import torch
from test_prefix_cache import _finish, _sampling, empty_caches, models  # noqa: F401  (fixtures: the tiny pair, caches emptied)
from test_runtime import sequence

from specdec import DraftModel
from specdec.decode.scheduler import Scheduler
from specdec.decode.sequence import Options


def _parked(target, lane, tokens: torch.Tensor):
    """`tokens` forwarded on `lane` from the prefix cache, then parked: the one entry the cache holds."""
    target.prefixes.start(lane, tokens)
    lane.prefill(tokens)
    target.prefixes.park(lane)
    (entry,) = target.prefixes.entries
    return entry


@pytest.mark.parametrize("cut", [1, 37, 128, 255, 256])
def test_rows_over_a_shared_prefix_equal_a_full_forward(models, cut):
    """An entry of 300 positions that another lane reads (so it is not taken over); a lane whose
    500-token prompt shares its first `cut` reads them in place and forwards the rest in one
    block (its keys' runs of 16 and blocks of 64 straddle the two runs where `cut` is not a
    multiple): the prompt's last row, a block of 4 rows and a tree's rows equal those of a
    lane that forwarded everything (torch.equal)."""
    target, _ = models
    first = sequence(300, seed=90)
    prompt = torch.cat([first[:cut], (first[cut : cut + 1] + 1) % 96, sequence(499 - cut, seed=92)])
    block, tree, parents = sequence(4, seed=91), sequence(5, seed=93), torch.tensor([-1, -1, 0, 2])

    def rows(lane) -> list[torch.Tensor]:
        return [lane.prefill(prompt, reuse=True), lane.forward(block), lane.forward_tree(tree, parents)]

    cold = target.lane(16)
    want = rows(cold)
    cold.release()
    source = target.lane(16)
    entry = _parked(target, source, first)
    reader = target.lane(16)
    assert target.prefixes.start(reader, torch.cat([first[:100], sequence(5, seed=94)])) == 100  # pins the entry
    warm = target.lane(16)
    assert target.prefixes.start(warm, prompt) == cut and warm.shared == (entry, cut) and entry.readers == 2
    got = rows(warm)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert warm.slots(0, cut).tolist() == list(range(entry.base, entry.base + cut))  # read in place
    for lane in (warm, reader):
        lane.release()
    assert entry.readers == 0


def _live(target, draft, lanes: int, cache: bool, kv_tokens: int = 4096, **sampling):
    """A request over a 96-token system prompt decodes; `lanes - 1` others with the same system
    prompt arrive while it runs. Each one's tokens, the scheduler, the requests and the
    positions all were active at once."""
    system = sequence(96, seed=60)
    prompts = [torch.cat([system, sequence(8, seed=61 + i)]) for i in range(lanes)]
    scheduler = Scheduler(target, DraftModel(draft, k=3), kv_tokens=kv_tokens, kv_chunk=16, prefix_cache=cache)
    requests = [scheduler.add(prompts[0], Options(8, eos_token_id=[], **sampling))]
    scheduler.step()
    scheduler.step()
    requests += [scheduler.add(p, Options(8, eos_token_id=[], **sampling)) for p in prompts[1:]]
    scheduler.admit()
    together = len(scheduler.active)
    state = [(r.decoding.lm, r.decoding.draft_lm) for r in requests] if together == lanes else []
    lanes_seen = [(lm.shared, lm.slots(0, lm.length).tolist(), scheduler.budget.claim(r))
                  for (lm, _), r in zip(state, requests)]
    results = _finish(scheduler)
    return [results[r.order].new_tokens for r in requests], requests, together, lanes_seen


@pytest.mark.parametrize("lanes", [2, 4])
@pytest.mark.parametrize("sampled", [False, True])
def test_live_lanes_read_one_prefix_in_place_and_equal_cold_starts(models, lanes, sampled):
    """Two and four live requests over one 96-token prefix: its positions in the first's lane
    become one entry that every lane reads in place (target and draft), the slots they read
    hold each prefix position once, each claims only its own positions, and every request's
    tokens equal a cold start's (greedy; sampled: the same seed)."""
    target, draft = models
    kw = dict(sampling=_sampling(0.9), seed=7) if sampled else {}
    cold, _, _, _ = _live(target, draft, lanes, cache=False, **kw)
    warm, requests, together, seen = _live(target, draft, lanes, cache=True, **kw)
    assert warm == cold and together == lanes
    assert [r.cached for r in requests] == [0] + [96] * (lanes - 1)
    entries = {id(shared[0]) for shared, _, _ in seen}
    assert len(entries) == 1 and all(shared[1] == 96 for shared, _, _ in seen)
    slots = [s for _, lane_slots, _ in seen for s in lane_slots]
    assert len(set(slots)) == len(slots) - 96 * (lanes - 1)  # the prefix's slots once, every other apart
    assert all(claim <= 16 for _, _, claim in seen)  # 8 prompt tokens, guesses and answer: not the prefix


def test_four_requests_over_one_prefix_fit_a_budget_copies_would_overflow(models):
    """Four requests of 104 prompt tokens (96 shared) and 8 new ones in a budget of 192 positions:
    read in place they need 96 + 4 x 16 and run at once, none preempted, the budget held every
    step (_finish); four copies would need 4 x 112."""
    target, draft = models
    want, _, _, _ = _live(target, draft, 4, cache=False)
    got, requests, together, _ = _live(target, draft, 4, cache=True, kv_tokens=192)
    assert got == want and together == 4 and all(r.preempted == 0 for r in requests)


def test_an_entry_a_live_lane_reads_is_never_evicted_and_its_last_reader_frees_it(models):
    """An entry of 40 positions read in place by a lane (10 of them): eviction passes it over;
    the reader's own entry, parked, reads it too and counts only its own slots; dropping that
    child frees the entry for eviction, which gives its slots back to the pool. A cleared cache
    keeps an entry a live lane reads (no new lane finds it) until that lane lets it go."""
    target, _ = models
    cache, pool = target.prefixes, target.pool
    prompt = sequence(40, seed=70)
    source = target.lane(16)
    entry = _parked(target, source, prompt)
    reader = target.lane(16)
    other = torch.cat([prompt[:10], sequence(6, seed=71)])
    assert cache.start(reader, other) == 10 and entry.readers == 1
    reader.prefill(other, reuse=True)
    assert cache.evict(10**6) == 0 and cache.entries == [entry] and cache.pinned() == 40
    cache.park(reader)
    child = next(e for e in cache.entries if e is not entry)
    assert child.parent is entry and child.own() == 6 and cache.held() == 40 + 6 and entry.readers == 1
    held = pool.held()
    assert cache.evict(1) == 6 and cache.entries == [entry] and entry.readers == 0  # the child, least recently used
    assert cache.evict(1) == 40 and not cache.entries and pool.held() == held - child.size - entry.size
    entry = _parked(target, source, prompt)
    assert cache.start(reader, other) == 10
    cache.clear()
    assert cache.entries == [entry] and entry.doomed and cache.match(prompt).source is reader
    reader.release()
    assert not cache.entries


def test_a_small_share_of_an_unread_entry_is_copied_leaving_it_evictable(models):
    """A lane reusing 9 of an unread entry's 40 positions (under a quarter) copies them instead of
    pinning all 40 for 9; its rows still equal a cold start's, and the entry can be evicted."""
    target, _ = models
    cache = target.prefixes
    prompt = sequence(40, seed=75)
    source = target.lane(16)
    entry = _parked(target, source, prompt)
    other = torch.cat([prompt[:9], sequence(7, seed=76)])
    cold = target.lane(16)
    want = cold.prefill(other)
    cold.release()
    lane = target.lane(16)
    assert cache.start(lane, other) == 9 and lane.shared[0] is None and entry.readers == 0
    assert torch.equal(lane.prefill(other, reuse=True), want)
    assert cache.evict(10**6) == 40 and not cache.entries
    lane.release()

