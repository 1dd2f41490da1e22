"""Adaptive k by the cost model (specdec.adaptive.PayRule): the rule itself against the cost
model's own arithmetic, and in the engine: lossless, and rounds of different lengths."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdec import DraftModel, generate
from specdec.adaptive import PayRule
from specdec.bench.execute import Executor
from specdec.bench.methods import parse_method
from specdec.costmodel import Acceptance, Costs, cost_per_token
from specdec.errors import SpecdecError

from conftest import perturbed, tiny_model

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
    out = generate(target, prompt, drafter=DraftModel(draft, k=4, pay_rule=rule), max_new_tokens=40,
                   eos_token_id=[], check=True)
    assert out.new_tokens == plain.new_tokens
    lengths = set(out.stats.proposed_lengths[:-1])  # the last round is cut by max_new_tokens
    assert len(lengths) >= 2 and max(lengths) <= 4, out.stats.proposed_lengths


def write_report(path, **fields):
    report = {"c_target": 0.3, "c_draft": 0.1, "c_draft_int8": 0.06, "verify": {"1": 0.32, "2": 0.33, "3": 0.6}}
    report.update(fields)
    path.write_text(json.dumps(report))
    return path


def test_from_advice_reads_an_advise_report(tmp_path):
    path = write_report(tmp_path / "advice.json")
    rule = PayRule.from_advice(path, int8=True, k_max=4)
    assert rule.c_draft == 0.06 and rule.k_max == 4
    assert rule.c_verify[:4] == pytest.approx((0.3, 0.32, 0.33, 0.6))
    assert rule.c_verify[4] == pytest.approx(0.87)  # extrapolated upwards, never down
    assert PayRule.from_advice(path, int8=False, k_max=2).c_draft == 0.1


def test_bad_reports_say_what_to_give(tmp_path):
    with pytest.raises(SpecdecError, match="specdec advise --json"):
        PayRule.from_advice(tmp_path / "missing.json", int8=False, k_max=3)
    with pytest.raises(SpecdecError, match="no int8 draft cost"):
        PayRule.from_advice(write_report(tmp_path / "gpu.json", c_draft_int8=None), int8=True, k_max=3)


def test_bench_method_with_pay_needs_the_rule_file(pair, tmp_path):
    target, draft = pair
    method = parse_method("draft:k=4:pay=1", {"draft": 3}, 3)
    assert method.label == "draft:k=4:pay=1" and method.pay == 1
    with pytest.raises(SpecdecError, match="--pay-rule"):
        Executor(target, draft, None, None).prepare([method])
    executor = Executor(target, draft, None, None, pay_rule=str(write_report(tmp_path / "a.json")))
    executor.prepare([method])
    assert executor._proposer(method).pay_rule.k_max == 4
