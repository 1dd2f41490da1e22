"""Penalties and logit_bias under speculation (decode.penalties through decode.ruled): the
definitions against a plain reference; a block's row i transformed exactly as the one-row step
at its position (chains, trees, the draft's conversation; hypothesis over random sequences and
accept lengths); greedy speculation with rules equal to plain decoding with the same rules, bit
for bit, for every proposer and in a batch (the native runtime); the rules reach the draft (a
forced token is guessed and accepted every round)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import perturbed
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime import VOCAB, sequence, tiny

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft, generate
from specdec.decode.batch import Batch
from specdec.decode.penalties import Penalties
from specdec.decode.proposal import Proposal
from specdec.decode.ruled import rule_block, rule_rows, ruled_drafting
from specdec.decode.sequence import Options
from specdec.errors import SpecdecError
from specdec.proposers import SuffixHybrid, SuffixProposer
from specdec.runtime import from_transformers

# Every rule at once: bias first, llama.cpp's windowed repetition, OpenAI's output penalties.
ALL = Penalties(presence=0.6, frequency=0.4, repetition=1.3, window=12, logit_bias=((5, 2.0), (7, -100.0)))


def reference(row: list[float], prompt: list[int], output: list[int], p: Penalties) -> list[float]:
    """The definitions written out one token at a time (decode.penalties' docstring)."""
    out = list(row)
    for token, bias in p.logit_bias:
        out[token] += bias
    seen = (prompt + output)[-p.window:] if p.window else prompt + output
    for token in set(seen):
        out[token] = out[token] * p.repetition if out[token] <= 0 else out[token] / p.repetition
    for token in set(output):
        out[token] -= output.count(token) * p.frequency + p.presence
    return out


@pytest.mark.parametrize("p", [ALL, Penalties(repetition=1.5), Penalties(presence=-0.5, frequency=1.0),
                               Penalties(logit_bias=((0, 1.5),)), Penalties(repetition=0.8, window=None)])
def test_the_definitions_match_a_reference(p):
    gen = torch.Generator().manual_seed(0)
    prompt, output = sequence(20, seed=1).tolist(), sequence(15, seed=2).tolist()
    row = torch.randn(1, VOCAB, generator=gen) * 4
    got = rule_rows(p.rules(len(prompt), VOCAB), row.clone(), torch.tensor(prompt + output), len(prompt + output))
    expected = torch.tensor(reference(row[0].tolist(), prompt, output, p))
    torch.testing.assert_close(got[0], expected, rtol=1e-6, atol=1e-5)
    assert not torch.equal(got, row)  # every setting here changes the row


def test_settings_are_checked_and_off_means_no_rule():
    assert Penalties().rules(10, VOCAB) == () and Penalties(repetition=1.4, window=0).rules(10, VOCAB) == ()
    for bad, message in ((dict(presence=2.5), "presence penalty must be in"), (dict(frequency=float("nan")), "frequency"),
                         (dict(repetition=0.0), "repetition penalty must be > 0"), (dict(window=-1), "window"),
                         (dict(logit_bias=((3, 150.0),)), r"\[-100, 100\]")):
        with pytest.raises(SpecdecError, match=message):
            Penalties(**bad)
    with pytest.raises(SpecdecError, match="outside the vocabulary"):
        Penalties(logit_bias=((VOCAB, 1.0),)).rules(10, VOCAB)


# --- a block's row i is the one-row step at its position ------------------------------------

blocks = st.tuples(st.integers(1, 30), st.integers(0, 20), st.lists(st.integers(0, VOCAB - 1), max_size=8),
                   st.integers(0, 2**31 - 1))


def _one_row(rules, rows: torch.Tensor, context: torch.Tensor, i: int) -> torch.Tensor:
    return rule_rows(rules, rows[i : i + 1].clone(), context, context.numel())


@settings(max_examples=60, deadline=None)
@given(blocks, st.sampled_from([ALL, Penalties(repetition=1.2, window=3), Penalties(frequency=-0.7)]))
def test_a_chains_row_is_transformed_as_the_one_row_step_at_its_position(block, p):
    prompt_n, output_n, guesses, seed = block
    seq = sequence(prompt_n + output_n, seed=seed % 1000)
    guesses = torch.tensor(guesses, dtype=torch.long)
    rows = torch.randn(guesses.numel() + 1, VOCAB, generator=torch.Generator().manual_seed(seed))
    rules = p.rules(prompt_n, VOCAB)
    got = rule_block(rules, rows.clone(), seq, Proposal(guesses))
    for i in range(rows.shape[0]):  # whatever the accept length, each row the verifier reads is right
        assert torch.equal(got[i : i + 1], _one_row(rules, rows, torch.cat([seq, guesses[:i]]), i))


@settings(max_examples=40, deadline=None)
@given(blocks, st.lists(st.integers(0, 10**6), min_size=1, max_size=8))
def test_a_trees_row_is_transformed_from_its_own_path(block, picks):
    prompt_n, output_n, _, seed = block
    seq = sequence(prompt_n + output_n, seed=seed % 1000)
    parents = [-1 if i == 0 else pick % (i + 1) - 1 for i, pick in enumerate(picks)]  # each parent before its child
    tokens = torch.tensor([pick % VOCAB for pick in picks])
    rows = torch.randn(len(parents) + 1, VOCAB, generator=torch.Generator().manual_seed(seed))
    rules = ALL.rules(prompt_n, VOCAB)
    got = rule_block(rules, rows.clone(), seq, Proposal(tokens, parents=torch.tensor(parents)))
    assert torch.equal(got[:1], _one_row(rules, rows, seq, 0))
    for node in range(len(parents)):
        path, at = [], node
        while at >= 0:
            path.insert(0, at)
            at = parents[at]
        assert torch.equal(got[1 + node : 2 + node], _one_row(rules, rows, torch.cat([seq, tokens[path]]), 1 + node))


@settings(max_examples=40, deadline=None)
@given(blocks, st.booleans())
def test_the_draft_is_sent_each_row_transformed_from_the_guesses_before_it(block, restricted):
    prompt_n, output_n, guesses, seed = block
    seq = sequence(prompt_n + output_n, seed=seed % 1000)
    head = torch.arange(0, VOCAB, 3) if restricted else None
    width = VOCAB if head is None else head.numel()
    raw = torch.randn(len(guesses) + 1, width, generator=torch.Generator().manual_seed(seed))
    received = []

    def drafting():  # feeds the unseen tail, then each guess, as DraftModel.drafting does
        received.append((yield seq[-2:]))
        for g in guesses:
            received.append((yield torch.tensor([g])))
        return Proposal(torch.tensor(guesses, dtype=torch.long))

    rules = ALL.rules(prompt_n, VOCAB)
    steps = ruled_drafting(drafting(), rules, seq, VOCAB, head)
    fed = next(steps)
    try:
        for row in raw:
            fed = steps.send(row.clone())
    except StopIteration as done:
        assert torch.equal(done.value.tokens, torch.tensor(guesses, dtype=torch.long))
    for i, (row, got) in enumerate(zip(raw, received)):
        full = row if head is None else torch.full((VOCAB,), float("-inf")).index_copy_(0, head, row)
        want = _one_row(rules, full[None], torch.cat([seq, torch.tensor(guesses[:i], dtype=torch.long)]), 0)[0]
        assert torch.equal(got, want if head is None else want[head])


# --- greedy speculation with rules equals plain decoding with them ---------------------------


@pytest.fixture(scope="module")
def models():
    """(target, draft, draft with a restricted head) on the native runtime: the draft a
    perturbed copy of the target, so its guesses are accepted often but not always."""
    model = tiny("qwen2", layers=2)
    draft = perturbed(copy.deepcopy(model), seed=2, scale=0.05)
    return (from_transformers(copy.deepcopy(model), "int4"), from_transformers(copy.deepcopy(draft), "int4"),
            from_transformers(draft, "int4", head_ids=torch.arange(0, VOCAB, 2)))


PROPOSERS = {
    "draft": lambda draft, restricted: DraftModel(draft, 3),
    "restricted head": lambda draft, restricted: DraftModel(restricted, 3),
    "lookup": lambda draft, restricted: PromptLookup(3),
    "hybrid": lambda draft, restricted: Hybrid(DraftModel(draft, 3), PromptLookup(3)),
    "tree": lambda draft, restricted: TreeDraft(DraftModel(draft, 3), 2),
    "suffix": lambda draft, restricted: SuffixProposer(4),
    "suffix+draft": lambda draft, restricted: SuffixHybrid(DraftModel(draft, 3), SuffixProposer(4)),
}


PROMPT = torch.cat([sequence(12, seed=4), sequence(6, seed=5), sequence(12, seed=4)])  # repeats: lookup guesses


@pytest.mark.parametrize("method", list(PROPOSERS))
@pytest.mark.parametrize("p", [ALL, Penalties(repetition=1.3, window=None), Penalties(presence=1.0, frequency=0.5)])
def test_greedy_speculation_with_rules_equals_plain_decoding_with_them(models, method, p):
    target, draft, restricted = models
    rules = lambda: p.rules(PROMPT.numel(), VOCAB)  # noqa: E731 - one set per generation
    plain = generate(target, PROMPT, max_new_tokens=40, eos_token_id=[], rules=rules()).new_tokens
    assert plain != generate(target, PROMPT, max_new_tokens=40, eos_token_id=[]).new_tokens  # the rules matter
    out = generate(target, PROMPT, drafter=PROPOSERS[method](draft, restricted), max_new_tokens=40, eos_token_id=[],
                   rules=rules(), check=True)
    assert out.new_tokens == plain
    if "draft" in method or method in ("tree", "hybrid", "restricted head"):
        assert 0 < out.stats.accepted < out.stats.proposed  # rounds accepted and rejected


def test_a_banned_token_never_comes_and_a_forced_one_is_guessed_by_the_draft(models):
    """logit_bias +100 on one id forces it (the target's rows and the draft's alike: every guess
    is that id and accepted); -100 on the plain output's first token bans it."""
    target, draft, _ = models
    plain = generate(target, PROMPT, max_new_tokens=24, eos_token_id=[]).new_tokens
    forced = next(t for t in range(VOCAB) if t not in plain)
    rules = Penalties(logit_bias=((forced, 100.0),)).rules(PROMPT.numel(), VOCAB)
    out = generate(target, PROMPT, drafter=DraftModel(draft, 3), max_new_tokens=24, eos_token_id=[], rules=rules)
    assert out.new_tokens == [forced] * 24 and out.stats.accepted == out.stats.proposed > 0
    banned = Penalties(logit_bias=((plain[0], -100.0),)).rules(PROMPT.numel(), VOCAB)
    out = generate(target, PROMPT, drafter=DraftModel(draft, 3), max_new_tokens=24, eos_token_id=[], rules=banned)
    assert plain[0] not in out.new_tokens


def test_a_batch_applies_each_sequences_own_rules(models):
    """Three prompts with different penalties decoded together (draft steps and blocks shared)
    equal each generated alone with its rules."""
    target, draft, _ = models
    prompts = [torch.cat([sequence(n, seed=n), sequence(6, seed=1)]) for n in (3, 17, 9)]
    settings_ = [ALL, Penalties(), Penalties(repetition=1.5, window=4, logit_bias=((1, 3.0),))]
    alone_out = [generate(target, q, drafter=DraftModel(draft, 3), max_new_tokens=20, eos_token_id=[],
                          rules=p.rules(q.numel(), VOCAB)).new_tokens for q, p in zip(prompts, settings_)]
    batch = Batch(target, DraftModel(draft, 3))
    started = [batch.add(q, Options(20, eos_token_id=[], rules=p.rules(q.numel(), VOCAB)))
               for q, p in zip(prompts, settings_)]
    while batch.running:
        assert all(error is None for _, error in batch.step())
    assert [d.result().new_tokens for d in started] == alone_out


def test_rules_take_one_prompt(models):
    target, _, _ = models
    with pytest.raises(SpecdecError, match="rules belong to one prompt"):
        generate(target, [PROMPT, PROMPT], max_new_tokens=4, rules=ALL.rules(PROMPT.numel(), VOCAB))
