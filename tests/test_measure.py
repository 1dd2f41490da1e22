"""Prefix reuse, cost-term timing, KV bytes, calibration and the advisor's decision (tiny models
and hand-computed cases)."""

import pytest
import torch
from conftest import word_tokenizer

from specdec import DraftModel, PromptLookup, generate
from specdec.cost.model import Acceptance, Costs, Rounds, predicted_speedup
from specdec.runtime.hf.causal_lm import CausalLM
from specdec.runtime.rows import shared_prefix
from specdec.decode.stats import GenerationStats
from specdec.errors import SpecdecError
from specdec.methods.spec import Method, parse
from specdec.prompts.long import articles, long_prompt
from specdec.tune.advise import ranking, recommend
from specdec.tune.calibration import Calibration
from specdec.tune.measure import (
    bandwidth_verdict,
    copy_bandwidth,
    kv_bytes,
    measure_model,
    measured_kv_bytes,
    read_bandwidth,
    time_blocks,
)


def fed_tokens(model) -> list[int]:
    """Records how many tokens each forward of `model` processes."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    return seen


@pytest.fixture
def models():
    from conftest import perturbed, tiny_model

    target = tiny_model(11)
    return target, perturbed(target, seed=3, scale=0.3)


def testshared_prefix():
    t = torch.tensor
    assert shared_prefix(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert shared_prefix(t([1, 2]), t([1, 2, 3])) == 2
    assert shared_prefix(t([9]), t([1])) == 0
    assert shared_prefix(t([], dtype=torch.long), t([1])) == 0


@pytest.mark.parametrize("proposer", ["draft", "lookup", "none"])
def test_reused_prefix_is_not_recomputed_and_output_is_unchanged(models, proposer):
    target, draft = models
    prompt = torch.arange(30) % 17 + 3
    fresh = generate(target, prompt, drafter=None, max_new_tokens=12, eos_token_id=[])
    t_lm, d_lm = CausalLM(target), CausalLM(draft)
    make = {"draft": lambda: DraftModel(d_lm, 2), "lookup": lambda: PromptLookup(2), "none": lambda: None}[proposer]
    target_fed, draft_fed = fed_tokens(target), fed_tokens(draft)
    first = generate(t_lm, prompt, drafter=make(), max_new_tokens=12, eos_token_id=[], reuse_prefix=True, check=True)
    assert target_fed[0] == 30  # nothing to reuse yet
    target_fed.clear(), draft_fed.clear()
    again = generate(t_lm, prompt, drafter=make(), max_new_tokens=12, eos_token_id=[], reuse_prefix=True, check=True)
    assert target_fed[0] == 1  # only the prompt's last token, whose logits start the generation
    if proposer == "draft":
        assert draft_fed[0] == 1
    assert first.new_tokens == again.new_tokens == fresh.new_tokens
    assert again.stats.target_calls == again.stats.rounds + 1
    # A prompt sharing only its first 10 tokens recomputes the rest.
    target_fed.clear()
    other = torch.cat([prompt[:10], prompt[:8] + 1])
    generate(t_lm, other, drafter=make(), max_new_tokens=4, eos_token_id=[], reuse_prefix=True, check=True)
    assert target_fed[0] == 8
    # Without reuse_prefix a passed-in CausalLM starts from scratch.
    target_fed.clear()
    generate(t_lm, prompt, max_new_tokens=2, eos_token_id=[])
    assert target_fed[0] == 30


def test_time_blocks_restores_the_cache_and_measure_model_maps_k_to_rows(models):
    target, _ = models
    lm = CausalLM(target)
    context = torch.arange(40) % 30 + 1
    costs = measure_model(lm, context, [2, 3, 5], repeats=2)
    assert lm.length == 40 and costs.context == 40
    assert set(costs.blocks) == {1, 2, 3, 5} and costs.blocks[1] == costs.step > 0
    assert costs.verify(2) == costs.blocks[3] and costs.verify(4) == costs.blocks[5]
    timed = time_blocks(lm, [4, 1, 4], repeats=1)
    assert set(timed) == {1, 4} and min(timed.values()) > 0 and lm.length == 40


def test_kv_bytes_formula_matches_the_cache_tensors(models):
    target, _ = models
    lm = CausalLM(target)
    lm.prefill(torch.arange(37))
    # tiny config: 2 layers, 2 KV heads of 32/4 = 8 dims, float32; K and V
    assert kv_bytes(target, 37) == 2 * 2 * 37 * 2 * 8 * 4 == measured_kv_bytes(lm)


def test_copy_and_read_bandwidth_are_positive():
    assert copy_bandwidth(megabytes=8, repeats=2) > 1e8  # any machine copies 100 MB/s
    assert read_bandwidth(megabytes=8, repeats=2) > 1e8


def stats_of(proposed, accepted, propose_s=0.4, accept_s=0.1) -> GenerationStats:
    s = GenerationStats()
    for p, a in zip(proposed, accepted):
        s.record_round(p, a)
    s.times.update(propose=propose_s, verify=1.0, accept=accept_s)
    s.finish(sum(accepted) + len(accepted) + 1)
    return s


def test_calibration_from_stats_hand_computed():
    cal = Calibration.from_stats([stats_of([2, 0, 2], [2, 0, 0]), stats_of([2], [1])])
    # position 1 judged in the 3 guessing rounds, accepted in 2; position 2 judged twice, accepted once
    assert cal.acceptance.rates == pytest.approx((2 / 3, 1 / 2))
    assert cal.acceptance.hit_rate == pytest.approx(3 / 4)
    assert cal.histogram == [1, 1, 1]
    assert cal.acceptance_rate == pytest.approx(3 / 6)
    assert cal.propose_per_round == pytest.approx(0.8 / 4) and cal.overhead_per_round == pytest.approx(0.2 / 4)


def test_calibration_records_what_the_rounds_did():
    """A width-2 tree at k=2 on two prompts: rounds (nodes, accepted, draft steps) (4, 2, 2),
    (4, 0, 2), then (0, 0, 0), a last round left no room (dropped), and (2, 1, 1), cut short."""
    first, second = GenerationStats(), GenerationStats()
    for s, rounds in ((first, [(4, 2, 2), (4, 0, 2), (0, 0, 0)]), (second, [(2, 1, 1)])):
        for nodes, accepted, steps in rounds:
            s.record_round(nodes, accepted, steps)
    rounds = Calibration.from_stats([first, second]).rounds
    # draft steps (2+2+1)/3; blocks of 4 nodes in 2 rounds of 3, of 2 in 1; tokens (3+1+2)/3
    assert rounds == Rounds(5 / 3, {2: 1 / 3, 4: 2 / 3}, 2.0) and rounds.nodes == pytest.approx(10 / 3)
    assert Calibration.from_stats([GenerationStats()]).rounds is None


def test_a_round_option_is_priced_from_its_measured_rounds():
    """Those rounds with C_T 0.1, C_D 0.03, C_V(2) 0.09, C_V(4) 0.12, overhead 0.01 a round and
    0.002 a plain step: a round costs 5/3*0.03 + (1/3*0.09 + 2/3*0.12) + 0.01 = 0.05 + 0.11 + 0.01
    = 0.17 s for 2 tokens, 0.085 s a token against plain decoding's 0.102: 1.2x."""
    rounds = Rounds(5 / 3, {2: 1 / 3, 4: 2 / 3}, 2.0)
    cal = Calibration(Acceptance((0.5, 0.5)), [], 0.5, 0.0, 0.01, 0.0, rounds=rounds)
    verify = {1: 0.08, 2: 0.09, 3: 0.1, 4: 0.12}
    tree = parse("draft:k=2:width=2")
    verdicts, choice = recommend(0.1, verify, 0.002, {tree: (0.03, cal)}, 4)
    assert verdicts[tree.label].k == 2 and verdicts[tree.label].speedup == pytest.approx(1.2, abs=1e-12)
    assert verdicts[tree.label].speedup_by_k == {2: pytest.approx(1.2, abs=1e-12)}
    assert "1.67 draft steps and verified 3.33 tokens, 1.70 target steps, for 2.00 tokens" in verdicts[tree.label].reason
    assert choice.method == tree.label and ranking(verdicts, [tree]) == [(tree, verdicts[tree.label].speedup)]
    # a hybrid's draft steps are measured: its share of draft rounds does not scale C_D again
    hybrid = parse("hybrid:k=2:conf=0.6")
    shared = Calibration(Acceptance((0.5, 0.5)), [], 0.5, 0.0, 0.01, 0.0, draft_share=0.25, rounds=rounds)
    assert recommend(0.1, verify, 0.002, {hybrid: (0.03, shared)}, 4)[0][hybrid.label].speedup == pytest.approx(1.2)
    # one that does not pay ranks nowhere, its prediction kept: 0.102 / (0.17 / 1.25)
    slow = Calibration(Acceptance((0.1,)), [], 0.5, 0.0, 0.01, 0.0, rounds=Rounds(5 / 3, {2: 1 / 3, 4: 2 / 3}, 1.25))
    verdicts, choice = recommend(0.1, verify, 0.002, {tree: (0.03, slow)}, 4)
    assert (verdicts[tree.label].k, verdicts[tree.label].speedup) == (0, 1.0) and choice.method == "ar"
    assert verdicts[tree.label].speedup_by_k[2] == pytest.approx(0.102 / (0.17 / 1.25))
    assert ranking(verdicts, [tree]) == []


def test_calibration_ignores_a_last_round_left_without_room():
    # a draft guessed in every round but the last, which max_new_tokens left empty
    cal = Calibration.from_stats([stats_of([2, 2, 0], [1, 2, 0])])
    assert cal.acceptance.hit_rate == 1.0 and cal.histogram == [0, 1, 1]


def test_calibration_counts_positions_never_accepted():
    cal = Calibration.from_stats([stats_of([3, 0, 2], [0, 0, 0])])
    assert cal.acceptance.rates == (0.0,) and cal.histogram == [2, 0]


def test_hit_rate_enters_cost_and_tokens():
    # Half the rounds guess 1 token that is always accepted. Free verify: a round costs one step
    # and yields 1.5 tokens. Verify of 2 rows at 2 steps: 0.5*2 + 0.5*1 = 1.5 steps for 1.5 tokens.
    acc = Acceptance((1.0,), hit_rate=0.5)
    assert predicted_speedup(Costs(1.0, 0.0, {1: 1.0}), acc, 1) == pytest.approx(1.5)
    assert predicted_speedup(Costs(1.0, 0.0, {1: 2.0}), acc, 1) == pytest.approx(1.0)


def calibration(rates, hit=1.0, propose=0.0) -> Calibration:
    return Calibration(Acceptance(tuple(rates), hit), [], 0.5, propose, 0.0, 1.0)


def test_recommend_picks_the_cheap_accurate_proposer_and_k():
    verify = {k: 1.0 for k in range(1, 9)}  # blocks free, as on a bandwidth-bound GPU
    verdicts, choice = recommend(1.0, verify, 0.0, {Method("draft", quant="int8"): (0.1, calibration([0.8] * 6)),
                                                    Method("lookup", ngram=3): (0.0, calibration([0.5] * 6, hit=0.3))}, 8)
    draft = verdicts["draft:quant=int8"]
    assert choice.method == f"draft:k={draft.k}:quant=int8" and draft.k > 2
    assert draft.speedup == pytest.approx(max(draft.speedup_by_k.values()))
    assert choice.predicted_speedup == pytest.approx(draft.speedup)


def test_recommend_says_no_when_the_draft_is_too_expensive():
    verify = {k: 1.0 + 0.5 * k for k in range(1, 5)}
    verdicts, choice = recommend(1.0, verify, 0.0, {Method("draft"): (0.9, calibration([0.6] * 4)),
                                                    Method("lookup", ngram=3): (0.0, calibration([], hit=0.0))}, 4)
    assert (choice.method, choice.predicted_speedup) == ("ar", 1.0)
    assert "too expensive" in verdicts["draft"].reason
    assert verdicts["lookup:ngram=3"].speedup is None


def test_bandwidth_verdict():
    fast_blocks = {1: 1.0, 4: 1.1}
    assert bandwidth_verdict(8e9, 1.0, 10e9, 5e9, fast_blocks)["bound"] == "bandwidth"
    assert bandwidth_verdict(2e9, 1.0, 10e9, 5e9, fast_blocks)["bound"] == "compute"
    assert bandwidth_verdict(8e9, 1.0, 10e9, 5e9, {1: 1.0, 4: 1.9})["bound"] == "mixed"
    # the share is of the read bandwidth, the step's roofline, not of the copy figure
    assert bandwidth_verdict(8e9, 1.0, 10e9, 5e9, fast_blocks)["share_of_read_bandwidth"] == pytest.approx(0.8)


def test_long_prompts_have_the_exact_length_and_share_their_ending():
    tok = word_tokenizer(64)
    prompts = {n: long_prompt(tok, n) for n in (400, 1000, 3000)}
    assert all(len(ids) == n for n, ids in prompts.items())
    # the same last article and request at every length; only the earlier context grows
    assert prompts[400] == prompts[1000][-400:] == prompts[3000][-400:]
    assert len(articles()) == 80 and all(len(a) > 500 for a in articles())
    with pytest.raises(SpecdecError, match="at least"):
        long_prompt(tok, 5)
    with pytest.raises(SpecdecError, match="at most"):
        long_prompt(tok, 10**7)


def test_weight_bytes_counts_what_a_step_reads():
    """An untied input embedding is read one row a step, so it is left out; once specdec's
    forward repacks the model, the packed layers (float32 head included) are counted instead."""
    from conftest import tiny_model

    from specdec.runtime.hf.prepare import prepare
    from specdec.tune.measure import weight_bytes

    model = tiny_model(0, vocab=64, layers=1)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = 64 * 32 * 4
    assert weight_bytes(model) == params - embedding
    prepare(model)
    assert weight_bytes(model) >= params - embedding  # packing may pad, never drops a layer
