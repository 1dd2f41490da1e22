"""Adaptive k by the cost model (specdec.proposers.policy.PayRule): the rule itself against the cost
model's own arithmetic, and in the engine: lossless, and rounds of different lengths."""

import json
from pathlib import Path

import pytest
from conftest import perturbed, tiny_model
from hypothesis import given
from hypothesis import strategies as st

from specdec import DraftModel, generate
from specdec.cost.model import Acceptance, Costs, cost_per_token
from specdec.errors import SpecdecError
from specdec.methods.build import Drafts, build_proposer
from specdec.methods.spec import parse
from specdec.proposers.policy import AcceptanceSchedule, AllOf, ConfidenceFloor, PayRule
from specdec.tune.advice import Advice

# The cost terms measured on this project's CPU (docs/advise/humaneval-int8.json), rounded:
# one target step 0.29 s, an int8 draft token 0.064 s, C_V jumping at 3 and 6 rows.
CPU = PayRule(0.064, (0.29, 0.32, 0.33, 0.60, 0.60, 0.62, 0.86, 0.86))


def test_the_measured_cpu_costs():
    assert CPU.guess_again([0.9])  # the second row is nearly free
    assert not CPU.guess_again([0.9, 0.9])  # the third row costs ~0.9 target steps
    assert CPU.guess_again([0.99, 0.99, 0.99])  # inside the flat 3-5 stretch, a sure draft goes on
    assert not CPU.guess_again([0.2])  # an unsure first guess: stop
    assert not CPU.guess_again([1.0] * 7)  # never past k_max


@given(
    c_draft=st.floats(0.0, 1.0),
    steps=st.lists(st.floats(0.05, 2.0), min_size=2, max_size=8),
    sure=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
)
def test_rule_is_the_cost_models_comparison(c_draft, steps, sure):
    """Guess again exactly when the cost model's cost per token of the longer round (the next
    guess as likely as the last) is below that of the round as it stands."""
    verify = tuple(sorted(steps))  # a longer block never costs less
    rule = PayRule(c_draft, verify)
    i = len(sure)
    if i >= rule.k_max:
        assert not rule.guess_again(sure)
        return
    costs = Costs(verify[0], c_draft, dict(enumerate(verify)))
    now = cost_per_token(costs, Acceptance.from_rates(sure), i)
    longer = cost_per_token(costs, Acceptance.from_rates(sure + sure[-1:]), i + 1)
    if abs(now - longer) > 1e-9 * now:  # away from exact ties
        assert rule.guess_again(sure) == (longer < now)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(60)
    return target, perturbed(target, 3, scale=0.05)


def test_lossless_and_rounds_of_several_lengths(pair):
    target, draft = pair
    prompt = list(range(1, 20))
    plain = generate(target, prompt, max_new_tokens=40, eos_token_id=[])
    # a cheap draft and a verify cost that doubles after 2 rows: rounds stop at 1, 2 or go to 4
    rule = PayRule(0.02, (1.0, 1.0, 1.02, 2.0, 2.01))
    out = generate(target, prompt, drafter=DraftModel(draft, k=4, policy=rule), max_new_tokens=40,
                   eos_token_id=[], check=True)
    assert out.new_tokens == plain.new_tokens
    lengths = set(out.stats.proposed_lengths[:-1])  # the last round is cut by max_new_tokens
    assert len(lengths) >= 2 and max(lengths) <= 4, out.stats.proposed_lengths


COMMITTED = Path(__file__).parent.parent / "docs" / "advise" / "humaneval-int8.json"  # written before version 2


def test_pay_rule_from_an_advise_report():
    advice = Advice.load(COMMITTED)
    rule = advice.pay_rule(parse("draft:k=4:quant=int8:pay=1"))
    assert rule.c_draft == pytest.approx(0.0642524989998492) and rule.k_max == 4
    assert rule.c_verify[:4] == pytest.approx((0.29141038799934904, 0.3184504700002435, 0.3314189820011961,
                                                0.5956523409986403))
    assert advice.pay_rule(parse("draft:k=2:pay=1")).c_draft == pytest.approx(0.11895168800037936)
    # a restricted head without a measurement of its own is charged its full-head draft's cost
    assert advice.pay_rule(parse("draft:k=2:vocab=100:quant=int8:pay=1")).c_draft == rule.c_draft
    # what advise --json writes now reads back as it was
    assert Advice.from_json(json.loads(json.dumps(advice.to_json()))) == advice


def test_pay_rule_extrapolates_upwards_only():
    advice = Advice(settings={}, device="cpu", dtype="float32", c_target=0.3, verify={1: 0.32, 2: 0.33, 3: 0.6},
                    c_draft={"draft": 0.1}, calibration={}, proposers={}, choice=None)
    rule = advice.pay_rule(parse("draft:k=4:pay=1"))
    assert rule.c_verify == pytest.approx((0.3, 0.32, 0.33, 0.6, 0.87))  # extrapolated upwards, never down


def test_bad_reports_say_what_to_give(tmp_path):
    with pytest.raises(SpecdecError, match="specdec advise --json"):
        Advice.load(tmp_path / "missing.json")
    gpu = Advice.load(Path(__file__).parent.parent / "docs" / "advise" / "humaneval.json")  # no int8 draft there
    with pytest.raises(SpecdecError, match="no cost of the draft draft:quant=int8"):
        gpu.pay_rule(parse("draft:k=3:quant=int8:pay=1"))


def test_method_with_pay_needs_the_rule_file(pair):
    target, draft = pair
    method = parse("draft:k=4:pay=1")
    assert method.label == "draft:k=4:pay=1" and method.pay
    with pytest.raises(SpecdecError, match="--pay-rule"):
        build_proposer(method, Drafts(draft))
    assert build_proposer(method, Drafts(draft), Advice.load(COMMITTED).rule_for(method)).policy.k_max == 4


def test_the_acceptance_schedule_follows_what_was_accepted():
    """dyn=1: +2 after a round that accepted every guess, -1 after one that did not, within
    [1, k]; a round that asked for nothing (the last) changes nothing; a new sequence restarts."""
    schedule = AcceptanceSchedule(5)
    seen = []
    for proposed, accepted in [(5, 2), (4, 4), (5, 0), (4, 1), (3, 0), (2, 0), (1, 0), (1, 1)]:
        assert schedule.budget(5) == proposed
        schedule.observe(proposed, accepted)
        seen.append(schedule.budget(5))
    assert seen == [4, 5, 4, 3, 2, 1, 1, 3]
    schedule.observe(0, 0)
    assert schedule.budget(5) == 3
    assert schedule.budget(2) == 2  # never more than the round's room
    schedule.begin()
    assert schedule.budget(5) == 5


def test_the_schedule_in_the_engine_is_lossless_and_moves_k(pair):
    target, draft = pair
    prompt = list(range(1, 20))
    plain = generate(target, prompt, max_new_tokens=40, eos_token_id=[])
    drafter = build_proposer(parse("draft:k=4:dyn=1"), Drafts(draft))
    assert isinstance(drafter.policy, AcceptanceSchedule)
    out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=[], check=True)
    assert out.new_tokens == plain.new_tokens
    # each round's length follows from the round before it, as the schedule says (the first
    # half: later rounds may be cut by the room left before max_new_tokens)
    lengths = out.stats.proposed_lengths[: out.stats.rounds // 2]
    for (before, accepted), now in zip(zip(lengths, out.stats.accept_lengths), lengths[1:]):
        assert now == min(4, before + 2) if accepted == before else now == max(1, before - 1), lengths
    assert len(set(lengths)) >= 2, lengths


def test_policies_combine_to_the_smallest_budget_and_every_stop():
    both = AllOf([ConfidenceFloor(0.5), PayRule(0.02, (1.0, 1.0, 1.02, 2.0, 2.01))])
    assert both.reads_confidence and both.budget(3) == 3
    assert not both.guess_again([0.4])  # the floor stops it
    assert not both.guess_again([0.9, 0.9])  # the pay rule stops it at the jump in C_V
    assert both.guess_again([0.99])
