"""`specdec check` passes on a correct engine and catches deliberately broken variants."""

import pytest
import torch
from conftest import perturbed, tiny_model

from specdec import DraftModel, PromptLookup
from specdec.conform import check
from specdec.conform import ties as conformance
from specdec.decode import sequence, verify
from specdec.external.hf import hf_greedy
from specdec.runtime.hf.model_facts import eos_token_ids
from specdec.proposers import draft as draft_module

PROMPTS = [[3, 7, 11, 3, 7, 12, 13], [5, 9, 5, 9, 5, 1]]
CONTEXT = [[1, 2, 3, 1, 2]]
PLAN = check.CheckPlan(samples=1200, top_k=3)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(7, vocab=16, layers=1, init=0.5)
    return target, perturbed(target, seed=7, scale=0.1)


def run_all(target, drafter):
    return check.run_checks([
        ("greedy", lambda: check.check_greedy(target, drafter, PROMPTS, 24)),
        ("sampling", lambda: check.check_sampling(target, drafter, CONTEXT, PLAN)),
        ("invariants", lambda: check.check_invariants(target, drafter, PROMPTS[0], 24)),
    ])


def test_correct_engine_passes(pair):
    target, draft = pair
    for drafter in (DraftModel(draft, 3), PromptLookup(3)):
        results = run_all(target, drafter)
        assert all(r.passed for r in results), [r.detail for r in results if not r.passed]


def test_wrong_logits_row_is_caught(pair, monkeypatch):
    """Judging candidate i by row i+1 (an off-by-one) must fail the greedy check."""
    target, draft = pair
    shifted = lambda rows, d: verify.verify_greedy(torch.cat([rows[1:], rows[-1:]]), d)
    monkeypatch.setattr(sequence, "verify_greedy", shifted)
    result = check.check_greedy(target, DraftModel(draft, 3), PROMPTS, 24)
    assert not result.passed and "FAILURE" in result.detail


def test_residual_replaced_by_p_is_caught(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(verify, "residual", lambda p, q, tokens: p)  # on rejection, draw from p
    assert not check.check_sampling(target, DraftModel(draft, 3), CONTEXT, PLAN).passed


def test_untrimmed_draft_cache_is_caught(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(draft_module.DraftModel, "rollback", lambda self, n: None)
    results = check.run_checks([
        ("invariants", lambda: check.check_invariants(target, DraftModel(draft, 3), PROMPTS[0], 24)),
    ])
    assert not results[0].passed and "draft cache" in results[0].detail


def test_chi2_flags_zero_probability_outcomes():
    p, note = check.chi2_pvalue({(1,): 5, (2,): 1}, {(1,): 1.0}, 6)
    assert p == 0.0 and "zero-probability" in note


def test_marginal_of_a_hand_joint():
    joint = {(0, 1): 0.25, (0, 2): 0.25, (1, 1): 0.5}
    assert check.marginal(joint, (0,)) == {(0,): 0.5, (1,): 0.5}
    assert check.marginal(joint, (1,)) == {(1,): 0.75, (2,): 0.25}


def test_greedy_check_allows_no_difference_even_at_a_tie(pair, monkeypatch):
    """Against specdec's own plain decoding there is no tolerance: with every gap counted as a
    near-tie, a speculative output changed at one token still fails."""
    target, draft = pair
    real = check.generate

    def spec_changed(model, prompt, drafter=None, **kw):
        out = real(model, prompt, drafter=drafter, **kw)
        if drafter is not None:
            out.new_tokens[5] = (out.new_tokens[5] + 1) % 16
        return out

    monkeypatch.setattr(check, "generate", spec_changed)
    monkeypatch.setattr(conformance, "NEAR_TIE_TOLERANCE", {torch.float32: 1e9})
    result = check.check_greedy(target, DraftModel(draft, 3), PROMPTS, 24)
    assert not result.passed and "FAILURE" in result.detail and "new token 5" in result.detail


def test_transformers_agreement_on_a_fresh_model():
    target = tiny_model(11, vocab=16, layers=1, init=0.5)  # transformers first, on unmodified layers
    eos = eos_token_ids(target)
    hf = [hf_greedy(target, p, 24, eos) for p in PROMPTS]
    result = check.check_transformers(target, PROMPTS, hf, 24)
    assert result.passed and result.detail.startswith("2/2 prompts equal"), result.detail


def test_transformers_difference_off_a_tie_fails():
    target = tiny_model(11, vocab=16, layers=1, init=0.5)
    eos = eos_token_ids(target)
    hf = [hf_greedy(target, p, 24, eos) for p in PROMPTS]
    hf[1][4] = (hf[1][4] + 1) % 16
    result = check.check_transformers(target, PROMPTS, hf, 24)
    assert not result.passed and result.detail.startswith("1/2 prompts equal"), result.detail
    assert "new token 4" in result.detail and "not a tie" in result.detail


def test_difference_kinds():
    from specdec.conform.ties import Difference

    assert Difference(0, 1, 2, 0.0, 0.5).kind == "exact tie"
    assert Difference(0, 1, 2, 0.125, 0.5).kind == "near-tie"
    assert Difference(0, 1, 2, 2.0, 0.5).kind == "not a tie"
