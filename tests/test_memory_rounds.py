"""The memory's hybrid (suffix+draft) under a server's plan: which part guesses a round, and that
its rounds keep guessing. A batch defers the draft's read of the prompt to its first guess, so a
hybrid whose memory took the first round had a draft lagging by the whole prompt; the plan judged
that lag as a draft left behind by plain rounds and kept the sequence plain to its end (one token
a round: 253 of 256 rounds on the default pair's first code-edit turn, reprlib). Tiny native
models, greedy, each output compared with plain decoding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_runtime import VOCAB, native_pair, sequence

from specdec import DraftModel, generate
from specdec.decode.batch import Batch
from specdec.decode.plan import Planner, curve
from specdec.decode.sampling import SamplingConfig
from specdec.decode.sequence import Options
from specdec.decode.stats import GenerationStats
from specdec.proposers import SuffixHybrid, SuffixProposer

GREEDY = SamplingConfig()
NEW = 40


@pytest.fixture(scope="module")
def models():
    return native_pair(capacity=128)


def dear_catch_up() -> Planner:
    """Costs under which a draft 100 tokens behind does not pay for its catch-up with the tokens
    a request has left (a 100-row draft block at 1.5 s)."""
    return Planner(curve({1: 0.024, 4: 0.026}), curve({1: 0.004, 8: 0.006}), curve({1: 0.004, 300: 4.5}))


def lone(proposed: list[int], draft_length: int, left: int = 100) -> SimpleNamespace:
    """A sequence of 301 committed tokens alone in the batch, after rounds that proposed these."""
    stats = GenerationStats()
    for n in proposed:
        stats.record_round(n, n // 2)
    return SimpleNamespace(stats=stats, length=301, new=128 - left, draft_lm=SimpleNamespace(length=draft_length),
                           options=SimpleNamespace(max_new_tokens=128))


def test_a_lone_draft_that_lags_only_where_it_was_not_needed_is_not_behind():
    """The same lag of 200 tokens: after rounds that all guessed (the memory's) the sequence
    guesses as its proposer says; after a plain round (the plan kept it plain) the plan weighs
    the catch-up, which here does not pay."""
    plan = dear_catch_up()
    assert plan([lone([8, 8, 6], draft_length=100)], [4]) == [4]
    assert plan([lone([8, 0, 6], draft_length=100)], [4]) == [0]
    assert plan([lone([8, 0, 6], draft_length=299)], [4]) == [4]  # caught up: not behind at all


def memory_of(stream: list[int], k: int = 8) -> SuffixProposer:
    memory = SuffixProposer(k)
    memory.finish(stream)
    return memory


def test_the_hybrid_takes_the_memorys_long_match_else_the_drafts_guesses(models):
    """With the sequence's continuation in memory (a 20-token match), the round's guesses are the
    memory's (8, as it remembers them) and the draft is not called; after a sequence the memory
    has never seen, they are the draft's own guesses, as the draft alone proposes them."""
    target, draft = models
    seq = sequence(20, seed=11)
    remembered = sequence(30, seed=12)
    hybrid = SuffixHybrid(DraftModel(draft, 3), memory_of(torch.cat([seq, remembered]).tolist()))
    hybrid.begin(seq[:-1], VOCAB)  # as after a prefill: the sequence's last token is pending
    calls = hybrid.calls
    got = hybrid.propose(seq, hybrid.k, GREEDY, None)
    assert got.tokens.tolist() == remembered[:8].tolist() and hybrid.calls == calls
    fresh = sequence(20, seed=13)
    alone = DraftModel(draft.lane(64), 3)
    alone.begin(fresh[:-1], VOCAB)
    want = alone.propose(fresh, 3, GREEDY, None).tokens.tolist()
    hybrid.begin(fresh[:-1], VOCAB)
    hybrid.memory.store = memory_of(sequence(40, seed=14).tolist()).store  # nothing of `fresh`
    got = hybrid.propose(fresh, hybrid.k, GREEDY, None)
    assert got.tokens.tolist() == want and hybrid.calls > calls


@pytest.mark.parametrize("round_rows", [0, 16])
def test_a_hybrid_whose_memory_takes_the_first_round_keeps_guessing_under_a_plan(models, round_rows):
    """A served request (a Batch with a plan, the draft's prompt read deferred) whose first
    tokens the memory knows: its first rounds are the memory's, then the draft guesses (its
    catch-up of the whole prompt is paid once, as the draft alone pays it in its first round).
    Every round but the last guesses (the plan kept it plain from round 2 before), the output is
    plain decoding's, and the draft made some of the rounds."""
    target, draft = models
    prompt = sequence(100, seed=21)
    plain = generate(target, prompt, max_new_tokens=NEW, eos_token_id=[]).new_tokens
    hybrid = SuffixHybrid(DraftModel(draft, 3), memory_of([*prompt.tolist(), *plain[:10]]))
    batch = Batch(target, hybrid, dear_catch_up(), round_rows)
    d = batch.add(prompt, Options(NEW, eos_token_id=[]))
    while batch.sequences:
        assert all(error is None for _, error in batch.step())
    result = d.result()
    assert result.new_tokens == plain
    stats = result.stats
    assert stats.proposed_lengths[0] > 0 and stats.draft_steps[0] == 0  # the memory's round
    assert stats.rounds_without_proposal <= 1, stats.proposed_lengths  # the last may have no room
    assert sum(stats.draft_steps) > 0
    assert stats.rounds < NEW - 5
