"""Several sequences in one forward (runtime.native.native_lm.NativeLM.forward_lanes, runtime.native.slot_pool) and
continuous batching (decode.batch): every row of a multi-sequence forward equals the row computed
alone, the slot pool's runs move and grow without losing a bit, and a batch's greedy outputs
equal each prompt generated alone, bit for bit, with every proposer, as sequences join and leave."""

from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import chisquare
from test_runtime import VOCAB, alone, native_pair, sequence, tiny

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft, generate
from specdec.decode.batch import Batch
from specdec.decode.sampling import SamplingConfig
from specdec.decode.sequence import Options
from specdec.errors import SpecdecError
from specdec.proposers.policy import ConfidenceFloor
from specdec.runtime import from_transformers
from specdec.runtime.native.native_lm import NativeLM


@pytest.fixture(scope="module")
def models():
    return native_pair()


def test_rows_of_several_sequences_in_one_forward_are_the_rows_alone(models):
    """Three lanes of different lengths, forwarded together in blocks of 1-5 rows (last_only
    for one), with a lane growing past its run and moving: every logits row equals that
    sequence's row decoded one token at a time alone."""
    target, _ = models
    seqs = [sequence(40, seed=s) for s in (1, 2, 3)]
    singles = [alone(target, s) for s in seqs]
    held = target.pool.held()
    lanes = [target.lane(slots=4) for _ in seqs]
    at = [0, 0, 0]
    for sizes in ([5, 1, 3], [1, 2, 1], [4, 4, 4], [1, 1, 5], [3, 5, 1], [5, 3, 2]):
        blocks = [(lm, s[a : a + n], i == 1) for i, (lm, s, a, n) in enumerate(zip(lanes, seqs, at, sizes))]
        got = NativeLM.forward_lanes(blocks)
        for i, n in enumerate(sizes):
            want = singles[i][at[i] : at[i] + n]
            assert torch.equal(got[i], want[-1:] if i == 1 else want), (sizes, i)
            at[i] += n
    assert [lm.length for lm in lanes] == at
    assert target.pool.held() == held + 32 + 16 + 16  # runs of 4 slots doubled to hold 19, 16, 16
    for lm in lanes:
        lm.release()
    assert target.pool.held() == held


def test_the_pool_moves_runs_keeping_their_keys_and_refuses_past_its_limit(models):
    """Lane a grows while lane b sits after it: a moves to free slots (its keys copied) and
    its later rows still equal the rows alone; a released run's slots are reused; a pool limit
    gives a one-line error."""
    target, _ = models
    tokens = sequence(30, seed=7)
    single = alone(target, tokens)
    a, b = target.lane(slots=4), target.lane(slots=4)
    a.forward(tokens[:4])
    b.forward(tokens[:3])
    base_a = a._base
    assert torch.equal(a.forward(tokens[4:20]), single[4:20]) and a._base != base_a
    b.release()
    c = target.lane(slots=4)
    c.forward(tokens[:2])
    assert c._base < a._base  # b's freed slots served c
    assert torch.equal(a.forward(tokens[20:30]), single[20:30])
    a.release(), c.release()
    limited = copy.copy(target.pool)
    limited._runs, limited.limit = {}, 8
    lane = NativeLM(target.decoder, (), None, limited, slots=4)
    lane.forward(tokens[:8])
    with pytest.raises(SpecdecError, match="past its limit of 8"):
        lane.forward(tokens[8:9])


def test_the_pool_gives_memory_back_after_a_burst():
    """Three lanes grow the cache from 16 slots to hundreds; once they are released and only a
    short lane at the start is held, the cache shrinks back to its first 16 slots (its bytes
    with it), the short lane's keys kept: its next rows still equal the rows alone, growing the
    cache again; released too, the cache is 16 slots."""
    target = from_transformers(tiny("qwen2", layers=1), "int4", capacity=16)
    tokens = sequence(60, seed=9)
    single = alone(target, tokens)
    target.release()
    first = target.kv_bytes()
    short = target.lane(slots=8)
    assert torch.equal(short.forward(tokens[:6]), single[:6])
    burst = [target.lane(slots=4) for _ in range(3)]
    for lm in burst:
        assert torch.equal(lm.forward(tokens), single)
    grown = target.decoder.capacity
    assert grown >= 8 + 3 * 64 and target.kv_bytes() == first * grown // 16
    for lm in burst:
        lm.release()
    assert target.decoder.capacity == 16 and target.kv_bytes() == first
    assert torch.equal(short.forward(tokens[6:40]), single[6:40])  # kept its keys, then grew
    assert target.decoder.capacity > 16
    short.release()
    assert target.decoder.capacity == 16 and target.pool.held() == 0


def _proposers(draft):
    return {"plain": None, "draft": DraftModel(draft, k=3), "conf": DraftModel(draft, k=4, policy=ConfidenceFloor(0.6)),
            "lookup": PromptLookup(k=3), "hybrid": Hybrid(DraftModel(draft, k=3), PromptLookup(k=3)),
            "tree": TreeDraft(DraftModel(draft, k=3), width=2)}


@pytest.mark.parametrize("method", ["plain", "draft", "conf", "lookup", "hybrid", "tree"])
def test_a_batch_decodes_each_prompt_as_it_decodes_alone(models, method):
    """Four prompts of different lengths and budgets (one ends on an EOS id on the way) decoded
    together equal each generated alone, token for token (the native runtime: bit for bit)."""
    target, draft = models
    drafter = _proposers(draft)[method]
    prompts = [torch.cat([sequence(n, seed=n), sequence(6, seed=1)]) for n in (3, 17, 9, 30)]
    alone_out = [generate(target, p, drafter=drafter, max_new_tokens=24, eos_token_id=[]).new_tokens
                 for p in prompts]
    together = generate(target, prompts, drafter=drafter, max_new_tokens=24, eos_token_id=[])
    assert [r.new_tokens for r in together] == alone_out
    assert all(r.finish_reason == "length" for r in together)
    if drafter is not None and method != "lookup":
        assert all(r.stats.rounds < 24 for r in together)  # it did speculate
    eos = alone_out[1][5]
    ended = generate(target, prompts, drafter=drafter, max_new_tokens=24, eos_token_id=[eos])
    first = [generate(target, p, drafter=drafter, max_new_tokens=24, eos_token_id=[eos]) for p in prompts]
    assert [r.new_tokens for r in ended] == [r.new_tokens for r in first]
    assert [r.finish_reason for r in ended] == [r.finish_reason for r in first]


@pytest.mark.parametrize("round_rows", [0, 16])
@pytest.mark.parametrize("method", ["draft", "conf", "hybrid", "tree"])
def test_under_a_plan_the_draft_reads_the_prompt_only_when_its_sequence_first_guesses(models, method, round_rows):
    """A batch with a plan prefills the draft of a sequence that joins others with the prompt's
    first token only: a plan that keeps every sequence plain never runs the draft past that; one
    that turns guessing on after some plain rounds feeds the draft everything it missed in its
    first guessing round. So does the first sequence, which starts alone: by its first round
    others may have joined. Without a plan the draft reads the whole prompt at once, as
    generate's does. Outputs equal each prompt alone either way, whether the others' prompts
    are prefilled alone or ride in the first one's rounds (round_rows)."""
    target, draft = models
    drafter = _proposers(draft)[method]
    prompts = [torch.cat([sequence(n, seed=n), sequence(6, seed=1)]) for n in (3, 17, 9)]
    want = [generate(target, p, drafter=drafter, max_new_tokens=20, eos_token_id=[]).new_tokens for p in prompts]
    rounds = []

    def plain_then_guess(running, most, riding):
        rounds.append(1)
        return [0] * len(running) if len(rounds) <= 5 else list(most)

    for plan, guessed in ((lambda running, most, riding: [0] * len(running), False), (plain_then_guess, True)):
        batch = Batch(target, drafter, plan, round_rows)
        started = [batch.add(p, Options(20, eos_token_id=[])) for p in prompts]
        # alone too: the plan of its first round decides (with round_rows its prompt rides in
        # rounds of its own, the draft starting with its first token)
        assert started[0].draft_lm.length == (0 if round_rows else 1)
        assert bool(batch.joining) == (round_rows > 0)
        while batch.joining:  # the prompts ride in rounds, the others' in the first one's
            assert all(error is None for _, error in batch.step())
        assert all(d.draft_lm.length == 1 for d in started)  # the prompt's first token alone
        while batch.sequences:
            assert all(error is None for _, error in batch.step())
        results = [d.result() for d in started]
        assert [r.new_tokens for r in results] == want
        assert all((r.stats.draft_calls > 1) == guessed for r in results)
        assert all((r.stats.rounds < 19) == guessed for r in results)
    planless = Batch(target, drafter, None, round_rows)
    first = planless.add(prompts[0], Options(20, eos_token_id=[]))
    assert first.draft_lm.length == len(prompts[0])
    planless.remove(first)


def test_sequences_join_and_leave_between_rounds(models):
    """A batch that runs while sequences are added mid-way and one is removed: each finished
    output equals its prompt alone; a removed sequence frees its slots."""
    target, draft = models
    drafter = DraftModel(draft, k=3)
    prompts = [sequence(5 + 4 * i, seed=10 + i) for i in range(5)]
    want = [generate(target, p, drafter=drafter, max_new_tokens=16 + i, eos_token_id=[]).new_tokens
            for i, p in enumerate(prompts)]
    batch = Batch(target, drafter)
    started, finished = {}, {}
    for round_ in range(60):
        if round_ < len(prompts):
            started[round_] = batch.add(prompts[round_], Options(16 + round_, eos_token_id=[]))
        if round_ == 3:
            batch.remove(started[2])
        for d, error in batch.step() if batch.running else []:
            assert error is None
            finished[next(i for i, s in started.items() if s is d)] = d.result().new_tokens
        if not batch.running and round_ >= len(prompts):
            break
    assert sorted(finished) == [0, 1, 3, 4]
    assert all(finished[i] == want[i] for i in finished)
    assert started[2].lm.length == 0  # released


@pytest.mark.parametrize("method", ["plain", "draft"])
def test_a_prompt_that_joins_is_forwarded_in_chunks_inside_the_running_rounds(models, method):
    """A 50-token prompt added beside a running sequence (with a plan, where a draft guesses):
    each round forwards a chunk of its rows in the same target forward as the running
    sequence's block (filling it up to round_rows=16 rows), while the running sequence commits
    tokens; its first token comes with the round that forwards the prompt's end, and both
    outputs equal each prompt alone. A joiner removed mid-prompt frees its lanes; without
    round_rows (Batch's default) a sequence added beside others is prefilled at once."""
    rows = 16
    target, draft = models
    drafter = DraftModel(draft, k=3) if method == "draft" else None
    plan = (lambda running, most, riding: [min(1, m) for m in most]) if drafter is not None else None
    prompts = [sequence(7, seed=21), sequence(50, seed=22)]
    want = [generate(target, p, drafter=drafter, max_new_tokens=30, eos_token_id=[]).new_tokens for p in prompts]
    held = target.pool.held()
    batch = Batch(target, drafter, plan, round_rows=rows)
    first = batch.add(prompts[0], Options(30, eos_token_id=[]))
    assert batch.joining == {first: 0}  # alone, its prompt rides in a round of its own
    assert batch.step() == [] and first.new == 1 and batch.running == [first]
    joiner = batch.add(prompts[1], Options(30, eos_token_id=[]))
    assert joiner.lm.length == 0 and batch.joining == {joiner: 0} and batch.sequences == [first, joiner]
    lengths = [0]
    while joiner not in batch.running:
        before = first.new
        assert joiner.new == 0 and all(error is None for _, error in batch.step())
        assert first.new > before  # the running sequence decoded in every round of the prefill
        lengths.append(joiner.lm.length)
    steps = [b - a for a, b in zip(lengths, lengths[1:])]
    assert lengths[-1] == 50 and joiner.new == 1 and len(steps) == 4
    assert all(rows // 4 <= n < rows for n in steps[:-1]), steps  # beside the running block
    if drafter is not None:
        assert joiner.draft_lm.length == 1  # the prompt's first token: the rest with its first guesses
    while batch.sequences:
        assert all(error is None for _, error in batch.step())
    assert [first.result().new_tokens, joiner.result().new_tokens] == want
    batch.add(prompts[0], Options(30, eos_token_id=[]))
    batch.step()
    leaving = batch.add(prompts[1], Options(30, eos_token_id=[]))
    batch.step()
    assert 0 < leaving.lm.length < rows
    batch.remove(leaving)
    assert leaving.lm.length == 0 and not batch.joining and len(batch.running) == 1
    batch.remove(batch.running[0])
    assert target.pool.held() == held
    apart = Batch(target, drafter, plan)  # Batch's default round_rows 0, as serve --round-rows 0
    apart.add(prompts[0], Options(30, eos_token_id=[]))
    assert apart.add(prompts[1], Options(30, eos_token_id=[])).new == 1 and not apart.joining
    for d in apart.sequences:
        apart.remove(d)


def test_batched_sampling_keeps_the_targets_distribution(models):
    """Speculative sampling in batches of 8 (T=0.9, top_p=0.9, the draft's q judged per sequence):
    the second token, the first a round decides, over 2,000 draws (250 batches of 8 seeds),
    against its marginal under the target alone (sum over the first token t of p(t) p(. | t));
    chi-square p > 0.001 (a batch row judged by another sequence's q or rows, or a generator
    shared by the sequences, shifts it far past that), bins under 5 expected draws pooled."""
    from specdec.decode.sampling import probs

    target, draft = models
    prompt = sequence(12, seed=4)
    cfg = SamplingConfig(0.9, None, 0.9)
    target.reset()
    first = probs(target.prefill(prompt)[-1], cfg).double()
    marginal = torch.zeros(VOCAB, dtype=torch.float64)
    for t in first.nonzero().flatten().tolist():
        target.reset()
        marginal += first[t] * probs(target.prefill(torch.cat([prompt, torch.tensor([t])]))[-1], cfg).double()
    drafter = DraftModel(draft, k=3)
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for trial in range(250):
        for r in generate(target, [prompt] * 8, drafter=drafter, max_new_tokens=3, temperature=0.9,
                               top_p=0.9, seed=8 * trial, eos_token_id=[]):
            counts[r.new_tokens[1]] += 1
    expected = marginal / marginal.sum() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    expect = torch.cat([expected[big], expected[~big].sum().view(1)])
    assert counts[marginal == 0].sum() == 0
    assert chisquare(observed.numpy(), expect.numpy()).pvalue > 1e-3


def test_the_plan_guesses_where_rows_are_cheap_and_acceptance_high():
    """The cost model's k per sequence: rows nearly free and drafts cheap -> every sequence its
    full k; rows costing a whole step each -> no guesses; a sure sequence beside an unsure one
    in a batch whose rows grow in cost -> the sure one guesses more. Each choice is also the
    best of all k vectors by the same rate (exhaustive search over 0..4 per sequence)."""
    import itertools
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    def seq(judged: int, accepted: int):
        stats = GenerationStats()
        stats.position_judged, stats.position_accepted = [judged], [accepted]
        return SimpleNamespace(stats=stats, draft_lm=None)

    sure, unsure = seq(100, 95), seq(100, 20)
    cheap = Planner(curve({1: 0.024, 32: 0.030}), curve({1: 0.002, 8: 0.003}))
    assert cheap([sure, sure], [4, 4]) == [4, 4]
    dear = Planner(lambda n: 0.024 * n, lambda n: 0.005 * n)
    assert dear([unsure, unsure], [4, 4]) == [0, 0]
    middle = Planner(curve({1: 0.024, 4: 0.028, 8: 0.045, 16: 0.087}), curve({1: 0.004, 8: 0.010}))
    ks = middle([sure, unsure], [4, 4])
    assert ks[0] > ks[1]
    from specdec.decode.plan import acceptance

    alphas = [acceptance(sure), acceptance(unsure)]
    best = max(middle.rate(list(k), alphas) for k in itertools.product(range(5), repeat=2))
    assert middle.rate(ks, alphas) >= 0.98 * best


def test_the_plan_finds_guesses_that_pay_only_when_every_sequence_shares_the_draft_step():
    """Costs timed on the AMX Xeon (model 207) for the default pair: 4 sequences at 75%
    acceptance. One sequence's first guess loses (its draft step costs as much as four lanes'),
    a guess from each of the four gains ~20%: the plan takes it, and its rate is within 2% of
    the best of all 6^4 plans (the search one sequence at a time stopped at all-plain)."""
    import itertools
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    stats = GenerationStats()
    stats.position_judged, stats.position_accepted = [1000], [750]
    sequences = [SimpleNamespace(stats=stats, draft_lm=None)] * 4
    plan = Planner(curve({1: 0.050, 2: 0.055, 3: 0.055, 4: 0.058, 6: 0.064, 8: 0.069, 12: 0.105, 16: 0.117,
                          24: 0.175, 32: 0.223}), curve({1: 0.011, 2: 0.012, 4: 0.014, 8: 0.019}))
    alphas = [0.75] * 4  # the prior's weight is negligible against 1000 judged guesses
    assert plan.rate([1, 0, 0, 0], alphas) < plan.rate([0] * 4, alphas) < plan.rate([1] * 4, alphas)
    ks = plan(sequences, [5] * 4)
    best = max(plan.rate(list(k), alphas) for k in itertools.product(range(6), repeat=4))
    assert min(ks) >= 1 and plan.rate(ks, alphas) >= 0.98 * best


def test_a_cost_point_above_a_later_one_is_lowered_to_it():
    """More rows never cost less, so a reading above a later point's is taken as noise."""
    from specdec.decode.plan import curve

    cost = curve({1: 0.030, 2: 0.050, 4: 0.040, 8: 0.080})
    assert [cost(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0.030, 0.040, 0.040, 0.040, 0.080])
    assert cost(12) == pytest.approx(0.120)  # beyond the last point along the last two


def test_plan_costs_are_timed_in_passes_so_a_burst_of_interference_lifts_no_point(monkeypatch):
    """measured_plan under a fake clock: a forward over n rows costs fixed + per_row x n seconds,
    and ten consecutive forwards after the warm-up pass (a burst of interference) take three
    times as long. Each point is read once a pass, so every point keeps a clean least reading;
    had a point's readings been taken back to back, the points timed inside the burst would
    read 3x."""
    from types import SimpleNamespace

    import specdec.decode.batch as batch_module
    import specdec.decode.plan as plan_module

    now, calls = [0.0], [0]

    class Lane:
        def __init__(self, lm):
            self.lm = lm

        def prefill(self, tokens):
            pass

        def trim(self, length):
            pass

        def release(self):
            pass

    class LM:
        vocab_size = 100

        def __init__(self, fixed, per_row):
            self.fixed, self.per_row = fixed, per_row

        def lane(self, slots):
            return Lane(self)

    def forward(blocks):
        lm = blocks[0][0].lm
        calls[0] += 1
        now[0] += (lm.fixed + lm.per_row * sum(len(tokens) for _, tokens, _ in blocks)) * (3 if 30 <= calls[0] < 40 else 1)
        return []

    monkeypatch.setattr(batch_module, "forward_blocks", forward)
    monkeypatch.setattr(plan_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    target, draft = LM(0.020, 0.005), LM(0.004, 0.001)
    plan = plan_module.measured_plan(target, SimpleNamespace(draft_lm=draft))
    for name, lm, rows in (("verify", target, plan_module.ROWS), ("draft", draft, plan_module.DRAFT_ROWS),
                           ("catch_up", draft, plan_module.ROWS)):
        assert plan.measured[name] == pytest.approx({n: lm.fixed + lm.per_row * n for n in rows}), name
    assert plan.verify(5) == pytest.approx(0.045) and plan.draft(3) == pytest.approx(0.007)
    assert str(plan).startswith("verify over 1/2/3/4/6/8/12/16/24/32 rows 25/30/35/40/50/60/80/100/140/180 ms; "
                                "draft over 1/2/4/8 rows 5/6/8/12 ms")


def test_the_plan_spreads_a_lagging_drafts_catch_up_over_the_rounds_left():
    """A sequence whose draft has read only its prompt's first token: with 300 tokens to its
    catch-up block (costing 0.15 s) and few tokens left the plan keeps it plain; with many left,
    the same sequence guesses; a draft one token behind (the usual) pays nothing extra."""
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    def seq(draft_length: int, left: int):
        stats = GenerationStats()
        stats.position_judged, stats.position_accepted = [100], [90]
        return SimpleNamespace(stats=stats, length=301, new=128 - left, draft_lm=SimpleNamespace(length=draft_length),
                               options=SimpleNamespace(max_new_tokens=128))

    plan = Planner(curve({1: 0.024, 4: 0.026}), curve({1: 0.004, 8: 0.006}), curve({1: 0.004, 300: 0.15}))
    assert plan([seq(1, 4), seq(299, 100)], [4, 4])[0] == 0
    assert plan([seq(1, 100), seq(299, 100)], [4, 4])[0] > 0
    assert plan([seq(299, 4), seq(299, 100)], [4, 4])[0] > 0


def test_a_lone_sequence_guesses_as_its_proposer_says_unless_its_drafts_catch_up_does_not_pay():
    """Alone, a sequence gets its proposer's k from the plan, even where the plan's own rate
    would pick less (costs under which guessing loses); one whose draft has fallen 300 tokens
    behind (it joined under load and decoded plain) with 4 tokens left stays plain rather
    than pay the catch-up, and with 100 left catches up and guesses. A sequence in its first
    round, whose draft has read only the prompt's first token (a batch defers the draft's
    prefill to the first round's plan), is not behind that way: alone, it guesses as a request
    decoded by itself does (its draft then reads the prompt), even with 4 tokens left; beside
    a joining prompt it stays plain (no catch-up rides with a prompt)."""
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    def seq(draft_length: int, left: int, rounds: int = 20):
        stats = GenerationStats()
        stats.rounds, stats.position_judged, stats.position_accepted = rounds, [100], [90]
        return SimpleNamespace(stats=stats, length=301, new=128 - left, draft_lm=SimpleNamespace(length=draft_length),
                               options=SimpleNamespace(max_new_tokens=128))

    dear = Planner(lambda n: 0.024 * n, lambda n: 0.005 * n, curve({1: 0.004, 300: 0.15}))
    assert dear([seq(299, 50)], [3]) == [3]  # current: the proposer's k, whatever the costs
    assert dear([seq(299, 50), seq(299, 50)], [3, 3]) == [0, 0]
    plan = Planner(curve({1: 0.024, 4: 0.026}), curve({1: 0.004, 8: 0.006}), curve({1: 0.004, 300: 0.15}))
    assert plan([seq(1, 4)], [4]) == [0]
    assert plan([seq(1, 100)], [4])[0] > 0
    assert plan([seq(1, 4, rounds=0)], [4]) == [4]
    assert plan([seq(1, 4, rounds=0)], [4], lambda rows: 60) == [0]


def test_a_draft_never_catches_up_in_a_round_that_carries_a_prompt():
    """Under costs where a lagging draft's catch-up pays (cheap, 100 tokens left), the plan has
    it guess beside a caught-up sequence; in a round that carries a joining prompt's rows it
    keeps that sequence plain (the round is long already: the catch-up would lengthen every
    stream's wait) while the caught-up one may still guess; with every draft lagging, the round
    is plain."""
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    def seq(draft_length: int):
        stats = GenerationStats()
        stats.rounds, stats.position_judged, stats.position_accepted = 20, [100], [90]
        return SimpleNamespace(stats=stats, length=301, new=28, draft_lm=SimpleNamespace(length=draft_length),
                               options=SimpleNamespace(max_new_tokens=128))

    plan = Planner(curve({1: 0.024, 4: 0.026, 64: 0.1}), curve({1: 0.004, 8: 0.006}), curve({1: 0.001, 300: 0.01}))
    lagging, caught_up = seq(1), seq(299)
    assert all(k > 0 for k in plan([lagging, caught_up], [4, 4]))
    ks = plan([lagging, caught_up], [4, 4], lambda rows: 16)
    assert ks[0] == 0 and ks[1] > 0, ks
    assert plan([lagging, seq(100)], [4, 4], lambda rows: 16) == [0, 0]


def test_prompt_rows_riding_in_a_round_are_charged_to_the_prompt_and_guesses_pay_for_those_they_push_out():
    """Costs timed on the Zen 4 for the default pair (serve's start line): two sequences at 75%
    acceptance guess when they decode on their own. In rounds of 64 rows that carry a joining
    prompt, a guess row takes a prompt row's place, which then costs ~5 ms in a later round, so
    the plan keeps them plain; with the prompt's last 2 rows left, the round is short again and
    they guess. Each choice is the best of all 5^2 plans by the same rate."""
    import itertools
    from types import SimpleNamespace

    from specdec.decode.plan import Planner, curve
    from specdec.decode.stats import GenerationStats

    stats = GenerationStats()
    stats.position_judged, stats.position_accepted = [1000], [750]
    sequences = [SimpleNamespace(stats=stats, draft_lm=None)] * 2
    plan = Planner(curve({1: 0.036, 2: 0.038, 3: 0.039, 4: 0.043, 6: 0.051, 8: 0.055, 12: 0.080, 16: 0.105,
                          24: 0.150, 32: 0.198}), curve({1: 0.007, 2: 0.007, 4: 0.010, 8: 0.016}))

    def riding(pending: int, rows: int = 64):
        return lambda n: min(pending, max(rows - n, rows // 4))

    alphas = [0.75] * 2
    for ride, guesses in ((None, True), (riding(300), False), (riding(2), True)):
        ks = plan(sequences, [4, 4], ride)
        assert (min(ks) > 0) == guesses, (ride, ks)
        best = max(plan.rate(list(k), alphas, None, ride) for k in itertools.product(range(5), repeat=2))
        assert plan.rate(ks, alphas, None, ride) >= 0.98 * best


def test_the_plan_re_times_its_costs_from_the_forwards_it_runs():
    """Costs given at start under which guessing pays (rows nearly free); forwards then read
    while decoding cost a whole step per row. Three readings at a size change nothing, the
    fourth does (LEAST_READINGS), and the plan turns plain; a burst of interference in 3 of the
    16 recent readings moves no median; sizes between those read are scaled by the ratios
    around them."""
    from types import SimpleNamespace

    from specdec.decode.plan import LEAST_READINGS, RECENT, Planner, curve
    from specdec.decode.stats import GenerationStats

    stats = GenerationStats()
    stats.position_judged, stats.position_accepted = [100], [90]
    sure = [SimpleNamespace(stats=stats, draft_lm=None)] * 2
    plan = Planner(curve({1: 0.030, 16: 0.034}), curve({1: 0.002, 8: 0.003}))
    assert min(plan(sure, [4, 4])) > 0
    for n in (2, 4, 6, 8, 10):
        for _ in range(LEAST_READINGS - 1):
            plan.observe("verify", n, 0.030 * n)
    assert min(plan(sure, [4, 4])) > 0 and plan.retimed() == "nothing re-timed"
    for n in (2, 4, 6, 8, 10):
        plan.observe("verify", n, 0.030 * n)
    assert plan(sure, [4, 4]) == [0, 0]
    assert plan.verify(4) == pytest.approx(0.120) and plan.verify(5) == pytest.approx(0.150, rel=0.05)
    assert plan.retimed().startswith("verify over 2 rows x1.98, 4 rows x3.90, 6 rows x5.74")
    for reading in [0.300] * 3 + [0.060] * (RECENT - 3):
        plan.observe("verify", 2, reading)
    assert plan.verify(2) == pytest.approx(0.060)


def test_a_size_re_timed_dear_costs_no_more_than_a_larger_size_read():
    """Readings of 4-row forwards in a slow spell (x2) beside 6-row ones at x1: the 4 rows cost
    what 6 cost, not more, so plain rounds of 4 sequences are not priced above guessing rounds of
    6 rows (which the plan, choosing them, would keep re-timing while 4 rows stay dear)."""
    from specdec.decode.plan import LEAST_READINGS, Planner, curve

    given = curve({1: 0.030, 4: 0.040, 6: 0.050, 8: 0.060})
    plan = Planner(given, None)
    for _ in range(LEAST_READINGS):
        plan.observe("verify", 4, 2 * given(4))
        plan.observe("verify", 6, given(6))
    assert plan.verify(6) == pytest.approx(0.050) and plan.verify(4) == pytest.approx(0.050)
    assert plan.verify(5) <= plan.verify(6) and plan.verify(8) == pytest.approx(0.060)
    assert plan.verify(2) == pytest.approx(0.050)  # ratio x2 below the sizes read, floored by 6's


def test_guesses_must_promise_the_margin_over_plain_rows():
    """Four sequences at 75% acceptance under costs where the best plan's rate beats all-plain
    by 6% (within a noisy machine's error, MARGIN 10%): all plain; with the verify rows cheaper,
    the best beats plain by 25% and the plan takes it (within 2% of the best of all 5^4)."""
    import itertools
    from types import SimpleNamespace

    from specdec.decode.plan import MARGIN, Planner, curve
    from specdec.decode.stats import GenerationStats

    stats = GenerationStats()
    stats.position_judged, stats.position_accepted = [1000], [750]
    sequences = [SimpleNamespace(stats=stats, draft_lm=None)] * 4
    alphas = [0.75] * 4
    draft = curve({1: 0.007, 8: 0.012})
    for per_row, taken in ((0.0050, False), (0.0025, True)):  # a verify row beyond 4 costs per_row
        plan = Planner(curve({4: 0.045, 32: 0.045 + 28 * per_row}), draft)
        ks = plan(sequences, [4] * 4)
        best = max(plan.rate(list(k), alphas) for k in itertools.product(range(5), repeat=4))
        gain = best / plan.rate([0] * 4, alphas)
        assert (gain > 1 + MARGIN) == taken and gain > 1.0, gain  # 1.06 and 1.25
        assert (min(ks) > 0) == taken, (per_row, ks)
        assert not taken or plan.rate(ks, alphas) >= 0.98 * best


def test_a_batch_tells_its_plan_how_long_each_forward_took(models):
    """Every round's target forward is read at its rows (each sequence's block plus riding
    prompt rows) and every draft step at its lanes; outputs stay each prompt's alone."""
    from specdec.decode.plan import Planner, curve

    target, draft = models
    drafter = DraftModel(draft, k=3)
    plan = Planner(curve({1: 0.001, 32: 0.0011}), curve({1: 0.0001, 8: 0.0001}))
    prompts = [sequence(n, seed=40 + n) for n in (4, 9, 30)]
    want = [generate(target, p, drafter=drafter, max_new_tokens=12, eos_token_id=[]).new_tokens for p in prompts]
    batch = Batch(target, drafter, plan, round_rows=16)
    started = [batch.add(p, Options(12, eos_token_id=[])) for p in prompts]
    rounds = 0
    while batch.sequences:
        assert all(error is None for _, error in batch.step())
        rounds += 1
    assert [d.result().new_tokens for d in started] == want
    verify = {n: len(r) for (cost, n), r in plan.recent.items() if cost == "verify"}
    assert sum(verify.values()) == rounds and max(verify) > 3 * 4  # the prompts' rows rode in some
    assert {n for (cost, n) in plan.recent if cost == "draft"} <= {1, 2, 3}


def test_several_prompts_refuse_per_prompt_hooks(models):
    target, _ = models
    with pytest.raises(SpecdecError, match="on_commit and on_target_logits take one prompt"):
        generate(target, [[1, 2], [3, 4]], max_new_tokens=2, on_commit=lambda tokens, n: None)
