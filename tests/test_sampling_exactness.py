"""Speculative sampling is exact: generated tokens follow the target's own distribution.

Tiny float32 models (one layer, vocabulary 8, init 0.5: target entropy about 0.8 nats; the
draft is the target plus weight noise, total variation between p and q 0.36-0.52), so p and q
are peaked and differ, and rounds accept, reject and take bonuses. The exact joint distribution of the first four new tokens is enumerated from the
target's logits; N speculative generations are compared with it by a chi-square test per
position (cells with expected count < 5 merged), the same functions `specdec check` uses. Threshold: p-value > 1e-4 for the correct
rule (about 30 tests here, so a false alarm has probability < 0.3% and the seeds are fixed);
a known-wrong rule (resampling from p instead of the residual) must reach p-value < 1e-6.
"""

from collections import Counter

import pytest
import torch
from conftest import perturbed, tiny_model

from specdec import DraftModel, Hybrid, PromptLookup, generate
from specdec.conform.check import chi2_pvalue, exact_joint, sampling_pvalues
from specdec.decode import verify
from specdec.decode.sampling import SamplingConfig, probs
from specdec.models.draft_head import restrict_head
from specdec.models.draft_quant import int8_draft
from specdec.proposers.policy import ConfidenceFloor, PayRule

V, N, POSITIONS = 8, 2000, 4
PROMPT = list(range(V)) * 2  # every token occurs, so prompt lookup always finds a match
PASS, CAUGHT = 1e-4, 1e-6


def make_pair(seed: int):
    target = tiny_model(10 + seed, vocab=V, layers=1, init=0.5)
    return target, perturbed(target, seed, scale=0.1)


@pytest.fixture(scope="module")
def pair():
    return make_pair(0)


def sample(target, drafter, cfg: SamplingConfig, n: int = N) -> list[tuple[int, ...]]:
    # max_new_tokens=5 so that the first round may propose 3 tokens: positions 2..4 come
    # from acceptance, residual and bonus draws.
    return [tuple(generate(target, PROMPT, drafter=drafter, max_new_tokens=POSITIONS + 1,
                           temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                           min_p=cfg.min_p, seed=i, eos_token_id=[]).new_tokens[:POSITIONS])
            for i in range(n)]


def pvalues(target, drafter, cfg: SamplingConfig) -> list[float]:
    """Chi-square p-values of positions 1..4 and of positions 2+3 jointly."""
    results = sampling_pvalues(sample(target, drafter, cfg), exact_joint(target, PROMPT, cfg, POSITIONS))
    assert all("zero-probability" not in note for _, note in results.values()), results
    assert all(note != "one outcome only" for name, (_, note) in results.items() if name != "position 1")
    return [p for p, _ in results.values()]


CONFIGS = {
    "plain": SamplingConfig(1.0),
    "top_k": SamplingConfig(1.0, top_k=3),
    "top_p": SamplingConfig(1.0, top_p=0.9),
    # llama.cpp's chain: min-p after top-p, on the draft's q as on the target's p. N = 2000 and
    # PASS as above; min_p 0.15 keeps 1 or 2 tokens fewer than top_p alone in most of pair 2's rows.
    "min_p": SamplingConfig(1.0, top_p=0.95, min_p=0.15),
}


@pytest.mark.parametrize("name,seed", [("plain", 0), ("plain", 1), ("top_k", 2), ("top_p", 2), ("min_p", 2)])
def test_draft_model_sampling_matches_target(name, seed):
    target, draft = make_pair(seed)
    cfg = CONFIGS[name]
    ps = pvalues(target, DraftModel(draft, 3), cfg)
    assert min(ps) > PASS, ps


def test_int8_draft_sampling_matches_target():
    target, draft = make_pair(3)
    ps = pvalues(target, DraftModel(int8_draft(draft), 3), CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_adaptive_k_sampling_matches_target(pair):
    # Pair 0, as the other proposers' tests. (Pair 5 once gave a joint positions-2+3 p ~ 3e-5
    # with seeds 0..5999 for the plain draft too; the engine's draws were replayed by hand from
    # the generator and matched exactly, and fresh seeds 10^6.. gave p = 0.81 at N = 12000: a
    # fluctuation of that seed set, which larger N over the same seeds kept showing.)
    target, draft = pair
    ps = pvalues(target, DraftModel(draft, 3, policy=ConfidenceFloor(0.7)), CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_pay_rule_sampling_matches_target(pair):
    # Costs under which the rule stops after 1, 2 or 3 guesses depending on q (specdec.proposers.policy):
    # first rounds of 1, 2 and 3 guesses in 85, 20 and 95 of seeds 0..199.
    target, draft = pair
    rule = PayRule(0.05, (1.0, 1.0, 1.05, 1.1))
    ps = pvalues(target, DraftModel(draft, 3, policy=rule), CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_restricted_head_sampling_matches_target():
    # The draft scores 5 of the 8 ids (q = 0 on the rest): those 3 reach the output only through
    # residual and bonus draws, which the test therefore checks too. Pair 0 made afresh: its
    # draft must be cut before specdec first runs (and repacks) it.
    target, draft = make_pair(0)
    small = restrict_head(draft, torch.tensor([0, 2, 3, 5, 6]))
    ps = pvalues(target, DraftModel(small, 3), CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_hybrid_sampling_matches_target():
    # the prompt repeats, so some rounds come from lookup (point mass) and some from the draft
    target, draft = make_pair(4)
    hybrid = Hybrid(DraftModel(draft, 3), PromptLookup(3, max_ngram=2))
    ps = pvalues(target, hybrid, CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_prompt_lookup_sampling_matches_target(pair):
    target, _ = pair
    cfg = CONFIGS["plain"]
    ps = pvalues(target, PromptLookup(3, max_ngram=2), cfg)
    assert min(ps) > PASS, ps


def test_resampling_from_p_is_caught(pair, monkeypatch):
    """The same test must reject the classic bug: on rejection, drawing from p, not (p-q)+."""
    target, draft = pair
    cfg = CONFIGS["plain"]

    def wrong(p, q, tokens):
        return p

    monkeypatch.setattr(verify, "residual", wrong)
    ps = pvalues(target, DraftModel(draft, 3), cfg)
    assert min(ps) < CAUGHT, ps


def test_proposals_are_exercised(pair):
    """The tests above only mean something if rounds accept, reject and take bonuses."""
    target, draft = pair
    accepted = rejected = bonus = 0
    for seed in range(200):
        s = generate(target, PROMPT, drafter=DraftModel(draft, 3), max_new_tokens=5,
                     temperature=1.0, seed=seed, eos_token_id=[]).stats
        first = s.accept_lengths[0]
        accepted += first > 0
        rejected += first < 3
        bonus += first == 3
    assert min(accepted, rejected, bonus) >= 10, (accepted, rejected, bonus)


def test_single_position_rule_on_random_distributions():
    """Verifier alone, k=1, many random (p, q) pairs: the committed token is distributed as p."""
    gen = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(1.0)
    for trial in range(5):
        target_logits = torch.randn(2, V, generator=gen) * 3
        q = torch.softmax(torch.randn(V, generator=gen) * 3, -1)
        p = probs(target_logits[0], cfg)
        n, counts = 20000, Counter()
        for _ in range(n):
            d = torch.multinomial(q, 1, generator=gen)
            v = verify.verify_sampling(target_logits, d, q[None], cfg, gen)
            counts[((d if v.accepted else v.next_token).item(),)] += 1
        expected = {(t,): float(p[t]) for t in range(V)}
        assert chi2_pvalue(counts, expected, n)[0] > PASS
