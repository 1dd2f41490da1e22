"""Greedy speculation returns exactly the target's own greedy tokens (float32 tiny models)."""

import copy

import pytest
import torch
from conftest import perturbed, tiny_model

import specdec
from specdec import DraftModel, Hybrid, PromptLookup, generate
from specdec.models.draft_head import restrict_head
from specdec.models.draft_quant import int8_draft
from specdec.proposers.policy import ConfidenceFloor

SEEDS = range(4)


def case(seed: int):
    target = tiny_model(100 + seed)
    draft = perturbed(target, seed=seed, scale=0.4)
    # Copies are made before the first generation: specdec repacks a model's weights when it
    # first runs it, and a repacked model can no longer be quantized or cut.
    for model, kinds in ((draft, ("int8", "head")), (target, ("head", "head+int8"))):
        for kind in kinds:
            variant(model, kind)
    # A prompt with repeats, so prompt lookup finds n-grams to propose.
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 64, (6,), generator=gen)
    prompt = torch.cat([base, torch.randint(0, 64, (3,), generator=gen), base])
    plain = generate(target, prompt, max_new_tokens=40, eos_token_id=[])
    return target, draft, prompt, plain.new_tokens


@pytest.fixture(scope="module", params=SEEDS)
def seeded(request):
    return case(request.param)


# Keyed by the model itself (hashed by identity), which keeps it alive: keyed by id(), a freed
# model of an earlier seed could pass its id, and its int8 copy, to a later seed's model.
_VARIANTS: dict[tuple[torch.nn.Module, str], torch.nn.Module] = {}
# Every third token id: the restricted draft cannot guess the others, so rounds where the
# target wants one of them reject (and take the target's token) instead of matching.
HEAD = torch.arange(0, 64, 3)


def variant(model, kind: str):
    """A cheaper copy of `model` ("int8", "head" restricted to HEAD, or "head+int8"), made once."""
    if (model, kind) not in _VARIANTS:
        copied = copy.deepcopy(model)
        if "head" in kind:
            restrict_head(copied, HEAD)
        _VARIANTS[model, kind] = int8_draft(copied) if "int8" in kind else copied
    return _VARIANTS[model, kind]


def drafters(draft, target, k):
    return {
        "draft": DraftModel(draft, k),
        "int8 draft": DraftModel(variant(draft, "int8"), k),
        "restricted head": DraftModel(variant(draft, "head"), k),
        "restricted int8 self-draft": DraftModel(variant(target, "head+int8"), k),
        "hybrid": Hybrid(DraftModel(draft, k), PromptLookup(k, max_ngram=3)),
        "adaptive k": DraftModel(draft, k, policy=ConfidenceFloor(0.15)),
        "self": DraftModel(target, k),  # accepts everything: exercises the bonus path
        "lookup": PromptLookup(k, max_ngram=3),
    }


@pytest.mark.parametrize("k", range(1, 9))
def test_speculative_greedy_equals_plain(seeded, k):
    target, draft, prompt, plain = seeded
    for name, drafter in drafters(draft, target, k).items():
        out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=[], check=True)
        assert out.new_tokens == plain, (name, k)
        assert out.finish_reason == "length"
        assert out.stats.target_calls == out.stats.rounds + 1  # one forward per round + prefill


def test_prompt_in_blocks_and_either_cache_layout_give_the_same_tokens(seeded, monkeypatch):
    """Both the prefill's chunking (specdec.runtime.rows.PREFILL_CHUNK) and the cache layout are plumbing:
    the tokens stay the target's own."""
    import specdec.runtime.hf.causal_lm
    from specdec.runtime.hf.causal_lm import CausalLM

    target, draft, prompt, plain = seeded
    monkeypatch.setattr(specdec.runtime.hf.causal_lm, "PREFILL_CHUNK", 4)
    blocks = -(-len(prompt) // 4)
    for name, drafter in drafters(draft, target, 3).items():
        out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=[], check=True)
        assert out.new_tokens == plain, name
        assert out.stats.target_calls == out.stats.rounds + blocks
    dynamic = generate(CausalLM(target, preallocate=False), prompt, max_new_tokens=40, eos_token_id=[],
                       drafter=DraftModel(CausalLM(draft, preallocate=False), 3), check=True)
    assert dynamic.new_tokens == plain


def test_draft_actually_speculates(seeded):
    target, draft, prompt, _ = seeded
    out = generate(target, prompt, drafter=DraftModel(draft, 4), max_new_tokens=40, eos_token_id=[])
    assert 0 < out.stats.accepted < out.stats.proposed
    # int8 changes the draft's guesses a little, not its vocabulary or its usefulness
    quantized = DraftModel(variant(draft, "int8"), 4)
    assert quantized.lm.vocab_size == 64
    out8 = generate(target, prompt, drafter=quantized, max_new_tokens=40, eos_token_id=[])
    assert 0 < out8.stats.accepted < out8.stats.proposed
    # the hybrid uses both parts on this repetitive prompt
    hybrid = Hybrid(DraftModel(draft, 4), PromptLookup(4, max_ngram=3))
    lookup_guesses, lookup_propose = [], hybrid.lookup.propose
    hybrid.lookup.propose = lambda *a: lookup_guesses.append(found := lookup_propose(*a)) or found
    out_h = generate(target, prompt, drafter=hybrid, max_new_tokens=40, eos_token_id=[])
    lookup_rounds = sum(found.tokens.numel() > 0 for found in lookup_guesses)
    assert 0 < lookup_rounds < out_h.stats.rounds and hybrid.calls > 1
    # a draft forward per guess in the draft's rounds, none in lookup rounds (advise prices this)
    s = out_h.stats
    expected = [0 if found.tokens.numel() else n for found, n in zip(lookup_guesses, s.proposed_lengths)]
    assert s.draft_steps == expected + [0] * (s.rounds - len(lookup_guesses))  # a last round left no room
    # adaptive k: some rounds stop early, none guesses more than k
    adaptive = generate(target, prompt, drafter=DraftModel(draft, 4, policy=ConfidenceFloor(0.1)), max_new_tokens=40,
                        eos_token_id=[])
    assert max(adaptive.stats.proposed_lengths) == 4 and 0 < min(adaptive.stats.proposed_lengths[:-1]) < 4


def test_restricted_head_guesses_only_its_ids(seeded):
    target, _, prompt, plain = seeded
    restricted = DraftModel(variant(target, "head"), 4)
    guesses = []
    out = generate(target, prompt, drafter=restricted, max_new_tokens=40, eos_token_id=[],
                   on_commit=lambda tokens, from_draft: guesses.extend(tokens[:from_draft]))
    assert out.new_tokens == plain and guesses and set(guesses) <= set(HEAD.tolist())
    # a self-draft accepts all but the ids its head lacks
    outside = sum(t not in set(HEAD.tolist()) for t in plain[1:])
    assert outside > 0 and out.stats.accepted < out.stats.proposed
    self_out = generate(target, prompt, drafter=DraftModel(target, 4), max_new_tokens=40, eos_token_id=[])
    assert self_out.stats.accepted == self_out.stats.proposed
    assert self_out.stats.rounds < 40 / 4


@pytest.mark.parametrize("k", [2, 5])
def test_eos_at_every_position(seeded, k):
    """Make each generated token in turn the EOS: the output stops right after its first
    occurrence, wherever that falls inside a block, and nothing after it is committed."""
    target, draft, prompt, plain = seeded
    for pos in range(len(plain)):
        eos = plain[pos]
        expected = plain[: plain.index(eos) + 1]
        for name, drafter in drafters(draft, target, k).items():
            out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=eos, check=True)
            assert out.new_tokens == expected, (name, pos)
            assert out.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 3, 5])
def test_max_new_tokens_smaller_than_k(seeded, max_new):
    target, draft, prompt, plain = seeded
    for name, drafter in drafters(draft, target, 8).items():
        out = generate(target, prompt, drafter=drafter, max_new_tokens=max_new, eos_token_id=[], check=True)
        assert out.new_tokens == plain[:max_new], name
        assert out.finish_reason == "length"


def test_stats_are_consistent(seeded):
    target, draft, prompt, plain = seeded
    out = generate(target, prompt, drafter=DraftModel(draft, 5), max_new_tokens=40, eos_token_id=[])
    s = out.stats
    assert s.new_tokens == len(out.new_tokens) == 40
    assert s.accepted + s.rounds + 1 == s.new_tokens  # each round: accepted + one target token
    assert sum(s.accept_lengths) == s.accepted and sum(s.proposed_lengths) == s.proposed
    assert s.position_accepted[0] == sum(a >= 1 for a in s.accept_lengths)
    assert all(0 <= r <= 1 for r in s.position_acceptance)
    assert set(s.times) == {"prefill", "propose", "verify", "accept", "other"}
    assert s.tokens_per_s > 0


def test_bad_arguments_raise_clear_errors(target):
    with pytest.raises(specdec.SpecdecError, match="max_new_tokens"):
        generate(target, [1, 2], max_new_tokens=0)
    with pytest.raises(specdec.SpecdecError, match="empty"):
        generate(target, [], max_new_tokens=4)
    with pytest.raises(specdec.SpecdecError, match="context"):
        generate(target, [1] * 600, max_new_tokens=4)
    with pytest.raises(specdec.SpecdecError, match="tokenizer"):
        generate(target, [1, 999], max_new_tokens=4)
    with pytest.raises(specdec.SpecdecError, match="temperature"):
        generate(target, [1, 2], max_new_tokens=4, temperature=-1)
    with pytest.raises(specdec.SpecdecError, match="top_p"):
        generate(target, [1, 2], max_new_tokens=4, temperature=1, top_p=1.5)
    with pytest.raises(specdec.SpecdecError, match="k must be"):
        DraftModel(target, 0)
    with pytest.raises(specdec.SpecdecError, match="k must be"):
        PromptLookup(0)


def test_position_acceptance_is_conditional():
    """Rounds (proposed, accepted): (3,3), (3,0), (3,1), (2,2). Guess 1 is judged in all 4
    rounds, accepted in 3; guess 2 only in the 3 rounds that accepted guess 1, accepted in 2;
    guess 3 only in round 1 (round 3 stopped at guess 2, round 4 proposed 2), accepted there."""
    from specdec.decode.stats import GenerationStats

    s = GenerationStats()
    for proposed, accepted in [(3, 3), (3, 0), (3, 1), (2, 2)]:
        s.record_round(proposed, accepted)
    assert s.position_judged == [4, 3, 1]
    assert s.position_accepted == [3, 2, 1]
    assert s.position_acceptance == [3 / 4, 2 / 3, 1.0]


def test_the_first_token_goes_out_before_the_draft_reads_the_prompt(monkeypatch):
    """The first token is the target's own, so it is committed (streamed) before the draft's read
    of the prompt; a generation that ends with it never has the draft read the prompt at all."""
    target = tiny_model(1)
    draft = perturbed(target, seed=2, scale=0.3)  # before specdec prepares the target
    events: list[str] = []
    begin = DraftModel.begin

    def recorded(self, *args, **kwargs):
        events.append("draft reads the prompt")
        return begin(self, *args, **kwargs)

    monkeypatch.setattr(DraftModel, "begin", recorded)
    prompt = torch.tensor([3, 14, 15, 9, 2, 6])
    on_commit = lambda tokens, from_draft: events.append(f"commit {len(tokens)}") and False
    spec = generate(target, prompt, drafter=DraftModel(draft, 3), max_new_tokens=12, on_commit=on_commit)
    assert events[:2] == ["commit 1", "draft reads the prompt"] and events.count("draft reads the prompt") == 1
    assert spec.new_tokens == generate(target, prompt, max_new_tokens=12).new_tokens
    events.clear()
    generate(target, prompt, drafter=DraftModel(draft, 3), max_new_tokens=1, on_commit=on_commit)
    assert events == ["commit 1"]
