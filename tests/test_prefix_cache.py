"""The prefix cache of the native runtime's K/V pool (runtime.native.prefix_cache) driven through
the decode scheduler on tiny native models: a conversation's later turns start from the K/V its
earlier turns left (target and draft), forward only their new rows, and give the tokens a cold
start gives, bit for bit (greedy and seeded sampling, every proposer kind, prefixes that end
inside a chunk, on the 256-row edge of a prompt's rounds, or where a rejected guess's keys sit);
entries are evicted least recently used within the budget before anyone is preempted; a request
beside a live one with the same prefix copies it."""

from __future__ import annotations


import pytest
import torch
from test_runtime import native_pair, sequence

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft
from specdec.decode.scheduler import Scheduler
from specdec.decode.sequence import Options
from specdec.proposers.suffix import SuffixHybrid, SuffixProposer
from specdec.runtime.native.decoder import Decoder

PROPOSERS = {
    "plain": lambda draft: None,
    "draft": lambda draft: DraftModel(draft, k=3),
    "lookup": lambda draft: PromptLookup(k=3),
    "hybrid": lambda draft: Hybrid(DraftModel(draft, k=3), PromptLookup(k=3)),
    "suffix": lambda draft: SuffixHybrid(DraftModel(draft, k=3), SuffixProposer(k=6)),
    "tree": lambda draft: TreeDraft(DraftModel(draft, k=3), width=2),
}


@pytest.fixture(scope="module")
def models():
    return native_pair()


@pytest.fixture(autouse=True)
def empty_caches(models):
    for lm in models:
        lm.prefixes.clear()
    yield
    for lm in models:
        lm.prefixes.clear()


def _finish(scheduler: Scheduler, limit: int = 3000) -> dict:
    """Step until idle; each request's result by arrival order, the budget checked every step."""
    results = {}
    for _ in range(limit):
        if scheduler.idle:
            return results
        ended = scheduler.admit()
        assert scheduler.held() <= scheduler.kv_tokens
        ended += scheduler.round()
        for gone in ended:
            assert gone.error is None, gone.error
            results[gone.request.order] = gone.result
    raise AssertionError("the scheduler did not finish")


def _converse(target, drafter, turns: list[torch.Tensor], cache: bool, kv_tokens: int = 4096,
              round_rows: int = 0, **sampling) -> tuple[list[list[int]], list[int | None]]:
    """A conversation: turn i's prompt is turn i-1's prompt and answer, then turns[i]; one
    request at a time. Each turn's new tokens and the prompt positions it took from the cache."""
    scheduler = Scheduler(target, drafter, round_rows=round_rows, kv_tokens=kv_tokens, kv_chunk=16,
                          prefix_cache=cache)
    history, outputs, cached = torch.zeros(0, dtype=torch.long), [], []
    for i, extra in enumerate(turns):
        prompt = torch.cat([history, extra])
        request = scheduler.add(prompt, Options(12 + i, eos_token_id=[], **sampling))
        result = _finish(scheduler)[request.order]
        outputs.append(result.new_tokens)
        cached.append(request.cached)
        history = torch.cat([prompt, torch.tensor(result.new_tokens)])
    return outputs, cached


@pytest.mark.parametrize("method", list(PROPOSERS))
@pytest.mark.parametrize("sampled", [False, True])
def test_later_turns_start_from_the_cache_and_equal_a_cold_start(models, method, sampled):
    """Three turns (the first prompt 40 tokens, then 9 and 5 new ones): with the cache each
    later turn reuses its whole history but the pending token (the prompt and answer of the turn
    before, less the answer's last token, which the cache never forwarded), and every turn's
    tokens equal those without the cache (greedy; sampled: the same seed)."""
    target, draft = models
    turns = [sequence(40, seed=10), sequence(9, seed=11), sequence(5, seed=12)]
    kw = dict(sampling=_sampling(0.9), seed=7) if sampled else {}
    cold, none = _converse(target, PROPOSERS[method](draft), turns, cache=False, **kw)
    warm, cached = _converse(target, PROPOSERS[method](draft), turns, cache=True, **kw)
    assert warm == cold and none == [None, None, None]
    assert cached == [0, 40 + len(cold[0]) - 1, 40 + len(cold[0]) + 9 + len(cold[1]) - 1]


@pytest.mark.parametrize("cut", [1, 37, 128, 255, 256])
@pytest.mark.parametrize("adopt", [True, False])
def test_a_lane_started_from_the_cache_computes_every_row_as_a_cold_one(models, cut, adopt):
    """Rows forwarded after a cached prefix (an entry's run taken over, or a live lane's first
    positions made an entry both read in place) have the bits of the same rows of a lane that forwarded everything, in another
    chunking: the prompt's last row, then a block of 4 rows, compared with torch.equal."""
    target, _ = models
    first, block = sequence(300, seed=90), sequence(4, seed=91)
    prompt = torch.cat([first[:cut], (first[cut : cut + 1] + 1) % 96, sequence(299 - cut, seed=92)])
    cold = target.lane(16)
    want = [cold.prefill(prompt), cold.forward(block)]
    cold.release()
    source = target.lane(16)
    target.prefixes.start(source, first)  # a live lane (nothing cached yet)
    source.prefill(first[: 2 * cut])
    if adopt:
        target.prefixes.park(source)  # an entry of which the prompt reuses half
    warm = target.lane(16)
    assert target.prefixes.start(warm, prompt) == cut
    assert [e.length for e in target.prefixes.entries] == ([] if adopt else [cut])
    assert warm.shared[1] == (0 if adopt else cut)
    got = [warm.prefill(prompt, reuse=True), warm.forward(block)]
    for lane in (warm, source):
        lane.release()
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _plan(running, most, riding):
    """A plan that guesses what the proposer asks: a batch with a plan prefills a sequence's draft
    with its first guesses, not at its start, and lets its prompt ride in rounds."""
    return list(most)


@pytest.mark.parametrize("round_rows, plan", [(0, None), (0, _plan), (64, _plan)])
def test_a_follow_up_forwards_only_its_new_rows_through_target_and_draft(models, round_rows, plan):
    """After a first turn of 70 + 10 tokens, the second turn's first token costs the target only
    the rows the cache lacks (the answer's last token and the 11 new ones), and its whole decode
    costs the draft fewer rows than the history it did not read again (without the cache: all
    of it). The rows each decoder forwarded are counted."""
    target, draft = models
    turns = [sequence(70, seed=20), sequence(11, seed=21)]
    counted = {id(target.decoder): 0, id(draft.decoder): 0}
    original = Decoder.forward

    def counting(decoder, rows):
        counted[id(decoder)] += rows.tokens.numel()
        return original(decoder, rows)

    def second_turn(cache: bool, tokens: int) -> tuple[int, int, Scheduler]:
        scheduler = Scheduler(target, DraftModel(draft, k=3), plan, round_rows, kv_tokens=4096, kv_chunk=16,
                              prefix_cache=cache)
        first = scheduler.add(turns[0], Options(10, eos_token_id=[]))
        answer = _finish(scheduler)[first.order].new_tokens
        counted.update(dict.fromkeys(counted, 0))
        second = scheduler.add(torch.cat([turns[0], torch.tensor(answer), turns[1]]), Options(tokens, eos_token_id=[]))
        _finish(scheduler)
        target.prefixes.clear()
        draft.prefixes.clear()
        return second.cached, counted[id(target.decoder)], counted[id(draft.decoder)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Decoder, "forward", counting)
        cached, target_rows, _ = second_turn(True, 1)
        assert cached == 70 + 10 - 1 and target_rows == 1 + 11
        _, _, warm = second_turn(True, 6)
        _, _, cold = second_turn(False, 6)
    assert warm < 1 + 11 + 5 * (3 + 1) < 70 + 10 <= cold, (warm, cold)


@pytest.mark.parametrize("cut", [37, 255, 256, 257])
def test_prefixes_ending_inside_a_chunk_or_on_its_edge_equal_a_cold_start(models, cut):
    """A first request of 300 tokens (its prompt in rounds of 256 rows), then one that shares its
    first `cut` tokens and goes on differently: with the cache its tokens equal a cold start's,
    prefilled alone and in rounds; the first request's entry is copied, not taken over, when the
    second reuses less than half of it."""
    target, draft = models
    base = sequence(300, seed=30)
    other = torch.cat([base[:cut], sequence(20, seed=31)])
    for round_rows in (0, 64):
        outputs = {}
        for cache in (False, True):
            scheduler = Scheduler(target, DraftModel(draft, k=3), round_rows=round_rows, kv_tokens=4096,
                                  kv_chunk=16, prefix_cache=cache)
            first = scheduler.add(base, Options(6, eos_token_id=[]))
            _finish(scheduler)
            second = scheduler.add(other, Options(8, eos_token_id=[]))
            outputs[cache] = _finish(scheduler)[second.order].new_tokens
            if cache:
                assert second.cached == cut
                adopted = 2 * cut >= 300 + 6 - 1
                assert len(target.prefixes.entries) == (1 if adopted else 2)
            target.prefixes.clear()
            draft.prefixes.clear()
        assert outputs[True] == outputs[False], (cut, round_rows)
        del first


def test_a_prefix_that_ends_where_a_rejected_guess_was_written_equals_a_cold_start(models):
    """The slots past an entry's length hold the keys of guesses the target rejected: a prompt
    that goes on with another token there reuses the entry's positions only, and equals a cold
    start. Every position of the first answer is tried as the point where the prompts part."""
    target, draft = models
    prompt = sequence(30, seed=40)

    def run(tokens: torch.Tensor, n: int, cache: bool) -> tuple[list[int], int | None]:
        s = Scheduler(target, DraftModel(draft, k=3), kv_tokens=4096, kv_chunk=16, prefix_cache=cache)
        r = s.add(tokens, Options(n, eos_token_id=[]))
        return _finish(s)[r.order].new_tokens, r.cached

    whole = torch.cat([prompt, torch.tensor(run(prompt, 14, True)[0])])
    for at in range(30, whole.numel()):
        target.prefixes.clear()
        draft.prefixes.clear()
        run(prompt, 14, True)  # the entry: the first request's positions
        turn = torch.cat([whole[:at], (whole[at : at + 1] + 1) % 96, sequence(4, seed=at)])
        warm, cached = run(turn, 5, True)
        assert cached == min(at, whole.numel() - 1), at
        assert warm == run(turn, 5, False)[0], at


def test_entries_are_evicted_least_recently_used_within_the_budget(models):
    """Four conversations' first turns of 60 tokens (+ 8 answered) in a budget of 192 positions:
    their entries cannot all stay; the oldest go first, the budget holds every step (_finish),
    nobody is preempted for an entry, and a second turn of the newest conversation still reuses
    its history and equals a cold start."""
    target, draft = models
    scheduler = Scheduler(target, DraftModel(draft, k=3), kv_tokens=192, kv_chunk=16, prefix_cache=True)
    prompts = [sequence(60, seed=50 + i) for i in range(4)]
    answers = []
    for prompt in prompts:
        request = scheduler.add(prompt, Options(8, eos_token_id=[]))
        answers.append(_finish(scheduler)[request.order].new_tokens)
        assert request.preempted == 0
    held = [e.held[:8].tolist() for e in target.prefixes.entries]
    assert held == [p[:8].tolist() for p in prompts[-len(held):]] and len(held) < 4
    assert target.prefixes.held() <= 192 and draft.prefixes.held() <= target.prefixes.held()
    follow = torch.cat([prompts[-1], torch.tensor(answers[-1]), sequence(6, seed=59)])
    request = scheduler.add(follow, Options(10, eos_token_id=[]))
    warm = _finish(scheduler)[request.order].new_tokens
    assert request.cached == 60 + 8 - 1
    target.prefixes.clear()
    cold = Scheduler(target, DraftModel(draft, k=3), kv_tokens=192, kv_chunk=16)
    again = cold.add(follow, Options(10, eos_token_id=[]))
    assert _finish(cold)[again.order].new_tokens == warm


def test_two_live_requests_share_a_prefix_in_place_and_equal_cold_starts(models):
    """A request decodes; a second with the same first 50 tokens arrives while it runs: those
    positions of the first's live lane become an entry both lanes read in place (nothing
    copied, the slots counted once); both equal cold starts."""
    target, draft = models
    system = sequence(50, seed=60)
    a, b = torch.cat([system, sequence(7, seed=61)]), torch.cat([system, sequence(12, seed=62)])
    want = {}
    for cache in (False, True):
        scheduler = Scheduler(target, DraftModel(draft, k=3), kv_tokens=4096, kv_chunk=16, prefix_cache=cache)
        first = scheduler.add(a, Options(20, eos_token_id=[]))
        scheduler.step()
        scheduler.step()
        second = scheduler.add(b, Options(15, eos_token_id=[]))
        scheduler.admit()
        if cache:
            assert second.cached == 50 and first.decoding in scheduler.active
            (entry,) = target.prefixes.entries  # the first lane's 50 positions, where they lie
            assert entry.length == 50 and entry.readers == 2
            assert first.decoding.lm.shared == second.decoding.lm.shared == (entry, 50)
            assert scheduler.budget.shared(first) == scheduler.budget.shared(second) == 50
        results = _finish(scheduler)
        want[cache] = (results[first.order].new_tokens, results[second.order].new_tokens)
    assert want[True] == want[False]


def test_an_entry_that_another_holds_whole_is_not_kept(models):
    """A 24-token prompt answered with 40 tokens leaves an entry of 63 positions; asked again its
    lanes copy the 23 positions (less than half the entry: it stays for others) and end holding
    the same tokens (greedy), so no second entry is kept; one stopped after 3 tokens holds a
    prefix of it and leaves none either; one answered with 50 tokens holds all of it and more,
    and replaces it."""
    target, draft = models
    prompt = sequence(24, seed=80)
    scheduler = Scheduler(target, DraftModel(draft, k=3), kv_tokens=4096, kv_chunk=16, prefix_cache=True)
    for tokens, cached, length in ((40, 0, 63), (40, 23, 63), (3, 23, 63), (50, 23, 73)):
        request = scheduler.add(prompt, Options(tokens, eos_token_id=[]))
        _finish(scheduler)
        assert request.cached == cached and [e.length for e in target.prefixes.entries] == [length]


def test_generate_continues_a_conversation_on_its_own_runtime_with_reuse_prefix(models):
    """The library's way (no scheduler, no prefix cache): generate(reuse_prefix=True) on one
    runtime and one drafter keeps what their caches hold of the next prompt, so a second turn
    forwards only its new rows through the target, and gives the tokens of a cold start."""
    from specdec import generate

    target, draft = models
    lm, drafter = target.lane(16), DraftModel(draft.lane(16), k=3)
    first = sequence(50, seed=95)
    out = generate(lm, first, drafter=drafter, max_new_tokens=8, eos_token_id=[], reuse_prefix=True).new_tokens
    second = torch.cat([first, torch.tensor(out), sequence(6, seed=96)])
    rows = []
    forward = lm.decoder.forward

    def counting(r):
        rows.append(r.tokens.numel())
        return forward(r)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm.decoder, "forward", counting)
        warm = generate(lm, second, drafter=drafter, max_new_tokens=1, eos_token_id=[], reuse_prefix=True)
    assert sum(rows) == 1 + 6  # the first answer's last token, then the new ones
    cold_lm = target.lane(16)
    assert warm.new_tokens == generate(cold_lm, second, max_new_tokens=1, eos_token_id=[]).new_tokens
    for lane in (lm, drafter.lm, cold_lm):
        lane.release()


def test_a_failed_round_clears_the_cache(models):
    target, draft = models
    scheduler = Scheduler(target, DraftModel(draft, k=3), kv_tokens=4096, kv_chunk=16, prefix_cache=True)
    scheduler.add(sequence(20, seed=70), Options(4, eos_token_id=[]))
    _finish(scheduler)
    assert target.prefixes.entries and draft.prefixes.entries
    scheduler.recover(RuntimeError("a forward failed"))
    assert not target.prefixes.entries and not draft.prefixes.entries


def _sampling(temperature: float):
    from specdec.decode.sampling import SamplingConfig

    return SamplingConfig(temperature)
