"""Hand-computed checks of the speculative decoding cost model."""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec.cost.kv import kv_cache_bytes, kv_cache_bytes_for_config
from specdec.cost.model import (
    Acceptance,
    Costs,
    Rounds,
    break_even_alpha,
    cost_per_token,
    expected_accepted_iid,
    expected_tokens_iid,
    fit_alpha,
    optimal_k,
    predicted_speedup,
    prediction_error,
    round_cost,
)

# --- acceptance -----------------------------------------------------------------


def test_iid_expected_accepted_alpha_08_k4():
    # 0.8 + 0.64 + 0.512 + 0.4096 = 2.3616
    assert expected_accepted_iid(0.8, 4) == pytest.approx(2.3616, abs=1e-12)
    # Leviathan: (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616
    assert expected_tokens_iid(0.8, 4) == pytest.approx(3.3616, abs=1e-12)


def test_iid_edges():
    assert expected_accepted_iid(1.0, 5) == 5.0
    assert expected_accepted_iid(0.0, 5) == 0.0
    assert expected_tokens_iid(0.0, 5) == 1.0
    assert expected_accepted_iid(0.5, 0) == 0.0


def test_from_alpha_matches_iid_formula():
    acc = Acceptance.from_alpha(0.8, 4)
    assert acc.expected_accepted == pytest.approx(2.3616, abs=1e-12)


def test_rates_expected_accepted():
    acc = Acceptance.from_rates([1.0, 0.5, 0.5])
    # 1 + 1*0.5 + 1*0.5*0.5 = 1.75
    assert acc.expected_accepted == pytest.approx(1.75, abs=1e-12)
    assert acc.expected_tokens == pytest.approx(2.75, abs=1e-12)


def test_histogram_to_rates_and_expected_accepted():
    acc = Acceptance.from_histogram([10, 20, 30, 40])  # rounds with A = 0, 1, 2, 3
    assert acc.k == 3
    # reached_1 = 100, accepted_1 = 90; reached_2 = 90, accepted_2 = 70; reached_3 = 70, accepted_3 = 40
    assert acc.rates == pytest.approx((90 / 100, 70 / 90, 40 / 70), abs=1e-12)
    # (0*10 + 1*20 + 2*30 + 3*40) / 100 = 200 / 100 = 2.0
    assert acc.expected_accepted == pytest.approx(2.0, abs=1e-12)


def test_histogram_position_never_reached_gets_zero_rate():
    acc = Acceptance.from_histogram([5, 0, 0])  # every round rejected at position 1
    assert acc.rates == (0.0, 0.0)
    assert acc.expected_accepted == 0.0


@pytest.mark.parametrize("bad", [[], [0, 0, 0], [1, -1]])
def test_histogram_rejects_bad_counts(bad):
    with pytest.raises(ValueError):
        Acceptance.from_histogram(bad)


def test_rates_out_of_range_rejected():
    with pytest.raises(ValueError):
        Acceptance.from_rates([0.5, 1.2])


def test_at_k_truncates_and_extends():
    acc = Acceptance.from_rates([0.9, 0.6])
    assert acc.at_k(1).rates == (0.9,)
    assert acc.at_k(0).rates == ()
    assert acc.at_k(4).rates == pytest.approx((0.9, 0.6, 0.6, 0.6))  # the last measured rate repeated
    with pytest.raises(ValueError):
        Acceptance(()).at_k(1)  # nothing to extend


def test_fit_alpha_hand_cases():
    # k=1: E[A] = r1, so alpha = r1
    assert fit_alpha(Acceptance.from_rates([0.37])) == pytest.approx(0.37, abs=1e-12)
    # rates [1.0, 0.5]: E[A] = 1.5 = a + a^2 -> a = (sqrt(7) - 1) / 2
    assert fit_alpha(Acceptance.from_rates([1.0, 0.5])) == pytest.approx((math.sqrt(7) - 1) / 2, abs=1e-12)
    assert fit_alpha(Acceptance.from_rates([0.0, 0.3])) == 0.0
    assert fit_alpha(Acceptance.from_rates([1.0, 1.0])) == 1.0


def test_fit_alpha_reproduces_histogram_expected_accepted():
    acc = Acceptance.from_histogram([10, 20, 30, 40])
    alpha = fit_alpha(acc)
    assert expected_accepted_iid(alpha, 3) == pytest.approx(2.0, abs=1e-12)


rates_strategy = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=8)


def _histogram_from_rates(rates):
    """P(A = a) = r_1...r_a * (1 - r_{a+1}) for a < k, and r_1...r_k for a = k."""
    hist, reach = [], 1.0
    for r in rates:
        hist.append(reach * (1 - r))
        reach *= r
    hist.append(reach)
    return hist


@given(rates_strategy)
def test_property_rates_and_histogram_agree(rates):
    hist = _histogram_from_rates(rates)
    direct = sum(a * p for a, p in enumerate(hist))
    assert Acceptance.from_rates(rates).expected_accepted == pytest.approx(direct, abs=1e-9)
    assert Acceptance.from_histogram(hist).expected_accepted == pytest.approx(direct, abs=1e-9)


@given(rates_strategy)
def test_property_expected_accepted_monotone_in_k(rates):
    acc = Acceptance.from_rates(rates)
    values = [acc.at_k(k).expected_accepted for k in range(0, 13)]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))


@given(rates_strategy)
def test_property_fit_alpha_reproduces_expected_accepted(rates):
    acc = Acceptance.from_rates(rates)
    assert expected_accepted_iid(fit_alpha(acc), acc.k) == pytest.approx(acc.expected_accepted, abs=1e-9)


# --- costs ----------------------------------------------------------------------


def test_verify_interpolates_and_extrapolates():
    costs = Costs(c_target=0.25, c_draft=0.0, c_verify={1: 0.30, 4: 0.36, 8: 0.52})
    assert costs.verify(0) == pytest.approx(0.25)  # C_V(0) = C_T(1)
    assert costs.verify(1) == pytest.approx(0.30)
    assert costs.verify(2) == pytest.approx(0.32)  # 0.30 + (0.36 - 0.30) * 1/3
    assert costs.verify(6) == pytest.approx(0.44)  # 0.36 + (0.52 - 0.36) * 2/4
    assert costs.verify(10) == pytest.approx(0.60)  # 0.52 + 0.04 per k * 2


def test_verify_never_extrapolates_downwards():
    # a noisy last point (cheaper than the one before) must not make long blocks cheaper still
    costs = Costs(c_target=0.25, c_draft=0.0, c_verify={1: 0.50, 2: 0.30})
    assert costs.verify(3) == costs.verify(9) == pytest.approx(0.30)


def test_verify_single_point_uses_c_target_anchor():
    costs = Costs(c_target=0.25, c_draft=0.0, c_verify={4: 0.35})
    assert costs.verify(2) == pytest.approx(0.30)  # halfway between (0, 0.25) and (4, 0.35)
    assert costs.verify(8) == pytest.approx(0.45)  # 0.35 + 0.025 per k * 4


def test_verify_callable():
    costs = Costs(c_target=0.25, c_draft=0.0, c_verify=lambda k: 0.2 + 0.01 * k)
    assert costs.verify(5) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(c_target=0.0, c_draft=0.0, c_verify={1: 0.3}),
        dict(c_target=0.25, c_draft=-0.1, c_verify={1: 0.3}),
        dict(c_target=0.25, c_draft=0.0, c_verify={}),
    ],
)
def test_costs_validation(kwargs):
    with pytest.raises(ValueError):
        Costs(**kwargs)


HAND = Costs(c_target=0.25, c_draft=0.08, c_verify={4: 0.275}, c_overhead=0.01)


def test_round_cost_and_speedup_by_hand():
    acc = Acceptance.from_alpha(0.8, 4)
    # 4*0.08 + 0.275 + 0.01 = 0.32 + 0.275 + 0.01 = 0.605
    assert round_cost(HAND, Rounds.fixed(acc, 4)) == pytest.approx(0.605, abs=1e-12)
    # a round that guesses half the time verifies only the pending token otherwise:
    # 4*0.08 + 0.5*0.275 + 0.5*0.25 + 0.01 = 0.5925
    half = Rounds.fixed(Acceptance(acc.rates, hit_rate=0.5), 4)
    assert half.blocks == {4: 0.5, 0: 0.5} and round_cost(HAND, half) == pytest.approx(0.5925, abs=1e-12)
    # per token: 0.605 / 3.3616 = 0.17997381...
    assert cost_per_token(HAND, acc, 4) == pytest.approx(0.605 / 3.3616, abs=1e-12)
    # speedup: 0.25 / 0.17997381 = 0.25 * 3.3616 / 0.605 = 0.8404 / 0.605 = 1.38909090...
    assert predicted_speedup(HAND, acc, 4) == pytest.approx(1.3890909090909, abs=1e-9)


def test_baseline_overhead_raises_plain_cost():
    costs = Costs(c_target=0.25, c_draft=0.08, c_verify={4: 0.275}, c_overhead=0.01, c_baseline_overhead=0.01)
    # (0.25 + 0.01) * 3.3616 / 0.605
    assert predicted_speedup(costs, Acceptance.from_alpha(0.8, 4), 4) == pytest.approx(0.26 * 3.3616 / 0.605)


# --- break-even -----------------------------------------------------------------


def test_break_even_k1_hand_derived():
    # k=1: speedup = C_T (1 + a) / (C_D + C_V(1) + C_O) = 1
    #   -> a = (C_D + C_V(1) + C_O) / C_T - 1 = (0.05 + 0.26 + 0.02) / 0.25 - 1 = 0.32
    costs = Costs(c_target=0.25, c_draft=0.05, c_verify={1: 0.26}, c_overhead=0.02)
    assert break_even_alpha(costs, 1) == pytest.approx(0.32, abs=1e-12)
    # without overhead: a = (C_D + C_V(1)) / C_T - 1 = 0.31 / 0.25 - 1 = 0.24
    plain = Costs(c_target=0.25, c_draft=0.05, c_verify={1: 0.26})
    assert break_even_alpha(plain, 1) == pytest.approx(0.24, abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_break_even_plugs_back_to_speedup_one(k):
    alpha = break_even_alpha(HAND, k)
    assert alpha is not None and 0.0 < alpha < 1.0
    assert predicted_speedup(HAND, Acceptance.from_alpha(alpha, k), k) == pytest.approx(1.0, abs=1e-9)


def test_break_even_zero_when_alpha_zero_already_pays():
    # free proposer, verify exactly as cheap as a plain step, no overhead: alpha=0 breaks even
    flat = Costs(c_target=0.25, c_draft=0.0, c_verify=lambda k: 0.25)
    assert break_even_alpha(flat, 4) == 0.0
    # a tiny overhead makes alpha=0 lose, so the break-even moves above 0
    assert break_even_alpha(Costs(c_target=0.25, c_draft=0.0, c_verify=lambda k: 0.25, c_overhead=0.001), 4) > 0.0


def test_break_even_none_when_even_perfect_acceptance_loses():
    # k=2, alpha=1: 3 tokens for 2*0.5 + 0.3 = 1.3 s vs 3 * 0.25 = 0.75 s plain
    costly = Costs(c_target=0.25, c_draft=0.5, c_verify={2: 0.3})
    assert break_even_alpha(costly, 2) is None


# --- optimal k ------------------------------------------------------------------


def test_optimal_k_hand_case():
    # C_T = C_V(k) = 1, C_D = 0.1, alpha = 0.5: speedup(k) = (2 - 0.5^k) / (1 + 0.1 k)
    #   k=1: 1.5/1.1 = 1.3636, k=2: 1.75/1.2 = 1.4583, k=3: 1.875/1.3 = 1.4423, k=4: 1.9375/1.4 = 1.3839
    # beyond k=2 the numerator gains less than 0.125 while the denominator grows 0.1 per k.
    costs = Costs(c_target=1.0, c_draft=0.1, c_verify=lambda k: 1.0)
    k, speedup = optimal_k(costs, Acceptance.from_alpha(0.5, 4))
    assert k == 2
    assert speedup == pytest.approx(1.75 / 1.2, abs=1e-12)


def test_optimal_k_free_proposer_takes_largest_k():
    # nothing costs more with k, and every extra position adds tokens
    costs = Costs(c_target=1.0, c_draft=0.0, c_verify=lambda k: 1.0)
    assert optimal_k(costs, Acceptance.from_alpha(0.5, 1), k_max=6) == (6, pytest.approx(2 - 0.5**6))


def test_optimal_k_tie_goes_to_smaller_k():
    # position 2 is never accepted, so k=2..4 yield the same 1.5 tokens per unit cost as k=1
    costs = Costs(c_target=1.0, c_draft=0.0, c_verify=lambda k: 1.0)
    assert optimal_k(costs, Acceptance.from_rates([0.5, 0.0]), k_max=4) == (1, pytest.approx(1.5))


def test_optimal_k_zero_when_nothing_pays():
    costs = Costs(c_target=1.0, c_draft=0.1, c_verify=lambda k: 1.0)
    assert optimal_k(costs, Acceptance.from_alpha(0.0, 4)) == (0, 1.0)


# --- KV cache -------------------------------------------------------------------


def test_kv_bytes_qwen25_15b():
    # 2 * 28 layers * 8192 tokens * 2 kv heads * 128 dims * 2 bytes (bf16)
    assert kv_cache_bytes(28, 2, 128, 8192, 2) == 234_881_024


def test_kv_bytes_qwen25_05b():
    # 2 * 24 * 8192 * 2 * 64 * 2 = 48 * 8192 * 256 = 100,663,296
    assert kv_cache_bytes(24, 2, 64, 8192, 2) == 100_663_296


def test_kv_bytes_from_config_with_and_without_fallbacks():
    # Qwen2.5-0.5B shape: hidden 896 / 14 heads = 64 head_dim
    qwen05 = SimpleNamespace(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896)
    assert kv_cache_bytes_for_config(qwen05, 8192, 2) == 100_663_296
    explicit = SimpleNamespace(num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                               hidden_size=1536, head_dim=128)
    assert kv_cache_bytes_for_config(explicit, 8192) == 234_881_024
    # no GQA attribute and head_dim=None: 2 * 2 layers * 10 tokens * 4 heads * (32/4) dims * 4 bytes
    mha = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, head_dim=None)
    assert kv_cache_bytes_for_config(mha, 10, 4) == 2 * 2 * 10 * 4 * 8 * 4


def test_prediction_error():
    assert prediction_error(1.1, 1.0) == pytest.approx(0.1)
    assert prediction_error(0.9, 1.2) == pytest.approx(-0.25)
