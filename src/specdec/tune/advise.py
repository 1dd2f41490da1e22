"""`specdec advise`: measure every term of the cost model on this machine and say which proposer
and k to use, or that speculation does not pay here and why.

Steps: copy bandwidth; C_T(1) and C_V(k) for k = 1..k_max at the chosen context; the draft's
step C_D; acceptance by position of each proposer on a small calibration set (greedy, proposing
calibration_k tokens a round); then the cost model's optimal k per proposer; then the round
options of the best families at that k, each calibrated and priced from what its rounds did;
then the top few confirmed in a paired run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from ..cost.model import Costs, break_even_alpha, fit_alpha, optimal_k, predicted_speedup, round_cost, rounds_speedup
from ..errors import SpecdecError
from ..methods.spec import Method, parse
from ..proposers.policy import PayRule
from .advice import Advice, Choice, Verdict
from .calibration import Calibration

# Below this predicted speedup the advice is "don't speculate": the model's error (docs/bench) is
# of this order, so a smaller gain is not worth the second model's memory.
MIN_GAIN = 1.05


@dataclass(frozen=True)
class AdviseSettings:
    # Fields with a help text are `specdec advise` options too (cli.options.add_settings), each >= 1.
    context: int = field(default=512, metadata={"help": "context length (tokens) the costs are timed at"})
    k_max: int = field(default=16, metadata={"help": "largest k to time and consider"})
    calibration_k: int = field(default=6, metadata={"help": "guesses per round while measuring acceptance"})
    prompts: int = field(default=4, metadata={"help": "calibration prompts"})
    tokens: int = field(default=48, metadata={"help": "new tokens per calibration prompt"})
    repeats: int = 3  # timings per block size (medians)
    confirm: int = 3  # the top predicted methods run paired with plain decoding (0: none, --quick)
    round_options: bool = True  # calibrate and rank the best families' round options (not with --quick)


def recommend(
    c_target: float, verify: dict[int, float], baseline_overhead: float,
    proposers: dict[Method, tuple[float, Calibration]], k_max: int,
) -> tuple[dict[str, Verdict], Choice]:
    """Per proposer (its method without k -> (C_D per guess, calibration)): predicted speedup for
    every k, the best k, break-even acceptance; a round option (a full spec with k) priced from
    its measured rounds; then the overall choice, a full method spec, or plain decoding ("ar")
    where no proposer reaches MIN_GAIN."""
    per, best_of = {}, {}
    for family, (c_draft, cal) in proposers.items():
        # A model-free proposer's search time is per round, not per guess: charge it as overhead.
        overhead = cal.overhead_per_round + (cal.propose_per_round if c_draft == 0 else 0.0)
        if family.k is not None:  # its draft steps are measured: a hybrid's lookup rounds took none
            costs = Costs(c_target, c_draft, verify, overhead, baseline_overhead)
            per[family.label] = _priced_rounds(costs, cal, family.k)
            best_of[family.label] = family
            continue
        # A hybrid's draft steps run in its draft rounds only: a guess costs C_D times their share.
        costs = Costs(c_target, c_draft * cal.draft_share, verify, overhead, baseline_overhead)
        if not cal.acceptance.rates:
            per[family.label] = Verdict(0, None, "it never proposed a token on the calibration prompts")
            continue
        best_k, best = optimal_k(costs, cal.acceptance, k_max)
        alpha = fit_alpha(cal.acceptance)
        per[family.label] = Verdict(
            k=best_k, speedup=best, reason=_reason(costs, cal, alpha, best_k, best),
            speedup_by_k={k: predicted_speedup(costs, cal.acceptance, k) for k in range(1, k_max + 1)},
            alpha_fitted=alpha, hit_rate=cal.acceptance.hit_rate,
            break_even_alpha={k: break_even_alpha(costs, k) for k in (1, 2, 4, 8) if k <= k_max},
        )
        best_of[family.label] = replace(family, k=best_k)
    return per, _best(per, best_of)


def _priced_rounds(costs: Costs, cal: Calibration, k: int) -> Verdict:
    """A round option at its k, priced by the cost model from what its calibration rounds did."""
    rounds = cal.rounds
    if rounds is None:
        return Verdict(0, None, "it ran no round on the calibration prompts")
    speedup = rounds_speedup(costs, rounds)
    reason = (f"a round took {rounds.draft_steps:.2f} draft steps and verified {rounds.nodes:.2f} tokens, "
              f"{round_cost(costs, rounds) / costs.c_target:.2f} target steps, for {rounds.tokens:.2f} tokens")
    best_k, best = (k, speedup) if speedup > 1.0 else (0, 1.0)
    return Verdict(best_k, best, reason, speedup_by_k={k: speedup}, hit_rate=cal.acceptance.hit_rate)


def _best(per: dict[str, Verdict], best_of: dict[str, Method]) -> Choice:
    """The family with the highest predicted speedup at its best k, or plain decoding."""
    ranked = sorted((v.speedup, name) for name, v in per.items() if v.speedup is not None)
    if ranked and ranked[-1][0] >= MIN_GAIN:
        speedup, name = ranked[-1]
        return Choice(best_of[name].label, speedup, reason="the highest predicted speedup (not confirmed)")
    return Choice("ar", 1.0, reason=f"no method is predicted to reach {MIN_GAIN:.2f}x")


def ranking(per: dict[str, Verdict], families: list[Method]) -> list[tuple[Method, float]]:
    """Each family at its best k and each round option at its own, by predicted speedup, fastest
    first (those that pay at all)."""
    by_label = {f.label: f for f in families}
    paying = [(replace(by_label[name], k=v.k), v.speedup) for name, v in per.items()
              if v.speedup is not None and v.k > 0]
    return sorted(paying, key=lambda pair: -pair[1])


def _reason(costs: Costs, cal: Calibration, alpha: float, k: int, speedup: float) -> str:
    """Which term decides, in one sentence."""
    ratio = costs.c_draft / costs.c_target
    v2 = costs.verify(2) / costs.c_target
    if k and speedup >= MIN_GAIN:
        return (f"E[tokens/round] {cal.acceptance.at_k(k).expected_tokens:.2f} at k={k} outweighs a round cost of "
                f"{k * ratio + costs.verify(k) / costs.c_target:.2f} target steps")
    if ratio > 0 and costs.c_draft >= 0.5 * costs.c_target:
        return f"each guess costs {ratio:.2f} of a target step: the draft is too expensive"
    if v2 > 1.5:
        return f"verifying 2 guesses costs {v2:.2f} target steps: blocks are not free on this machine"
    be = break_even_alpha(costs, 1)
    return (f"acceptance is too low: fitted alpha {alpha:.2f} (hit rate {cal.acceptance.hit_rate:.2f}), "
            f"break-even at k=1 is {be if be is None else round(be, 2)}")


def run_advise(target, drafts, families: list[Method], tokenizer, settings: AdviseSettings,
               prompts: list[list[int]], progress: Callable[[str], None] = lambda _: None,
               saved: Advice | None = None) -> Advice:
    """Measure everything for the proposers `families` (methods without k: tune.candidates), then
    the hybrid over the draft variant ranked first, predict every k of each, calibrate the round
    options of the best families at their best k (settings.round_options), confirm the top
    `settings.confirm` in a paired run, and return the advice. `drafts`
    (specdec.methods.build.Drafts) holds the draft and its variants.

    With `saved` (the advice of a run elsewhere) the proposers' acceptance and rounds come from
    it and only the costs are measured here (nothing is confirmed): the models may then carry
    random weights, and `tokenizer` may be None (the timed context is then random token ids)."""
    from ..runtime.choose import runtime_of
    from .advice import rule_for
    from .candidates import NOT_RANKED, QUICK, draft_variant
    from .confirm import confirm, confirmed_choice
    from .measure import (
        activation_dtype,
        bandwidth_verdict,
        copy_bandwidth,
        decode_bytes,
        kv_bytes,
        measure_model,
        read_bandwidth,
        weight_bytes,
    )

    progress("read and copy bandwidth")
    bandwidth = read_bandwidth(device=target.device), copy_bandwidth(device=target.device)
    context = _context(target, tokenizer, settings.context)
    progress(f"target C_T(1), C_V(k) for k=1..{settings.k_max} at context {settings.context}")
    t_lm = runtime_of(target)
    t_costs = measure_model(t_lm, context, range(1, settings.k_max + 2), settings.repeats)
    verify = {k: t_costs.verify(k) for k in range(1, settings.k_max + 1)}
    draft_families = [f for f in families if f.uses_draft]
    if draft_families:
        drafts.prepare(draft_families)
    c_draft = {}
    for variant in dict.fromkeys(draft_variant(f) for f in draft_families):  # once per draft form
        progress(f"{variant.label} C_D")
        c_draft[variant.label] = measure_model(drafts.lm(variant), context, [1, 2], settings.repeats).step
    t_lm.reset()

    def pay(method: Method) -> PayRule | None:
        """pay=1 stops by the cost terms just measured, as --pay-rule FILE reads them from the record."""
        return rule_for(method, t_costs.step, verify, c_draft)

    calibrate = _calibrator(target, drafts, prompts, settings.tokens, pay)
    progress(f"plain decoding on {len(prompts)} calibration prompts")
    plain = calibrate(None)

    def measure(method: Method) -> tuple[float, Calibration] | None:
        """A family, calibrated at calibration_k, or a round option at its own k."""
        cost = c_draft.get(draft_variant(method).label, 0.0) if method.uses_draft else 0.0
        if saved is None:
            run = method if method.k is not None else replace(method, k=settings.calibration_k)
            progress(f"{run.label} proposer")
            return cost, calibrate(run)
        if method.label in saved.calibration:
            return cost, Calibration.from_record(saved.calibration[method.label], plain.overhead_per_round)
        return None

    measured = {f: m for f in families if (m := measure(f)) is not None}

    def predict() -> tuple[dict[str, Verdict], Choice]:
        return recommend(t_costs.step, verify, plain.overhead_per_round, measured, settings.k_max)

    # The hybrid over the draft form the cost model ranks first; from a saved run, the hybrids it
    # measured (its ranking came from its own costs).
    for family in _hybrids(t_costs.step, verify, plain.overhead_per_round, measured, settings.k_max, saved is None):
        if (hybrid := measure(family)) is not None:
            measured[family] = hybrid
    if saved is not None and not measured:
        raise SpecdecError(f"the acceptance file has no calibration of {', '.join(f.label for f in families)}")
    if settings.round_options:
        for variant in _round_options(predict()[0], list(measured), saved):
            if (options := measure(variant)) is not None:
                measured[variant] = options

    verdicts, choice = predict()
    confirmed = []
    top = ranking(verdicts, list(measured))[: settings.confirm]
    if saved is None and top:
        confirmed = confirm(target, drafts, top, prompts, settings.tokens, progress, pay)
        choice = confirmed_choice(confirmed, MIN_GAIN)
    models = {"target": target} | ({"draft": drafts.held(draft_families[0].draft_variant)} if draft_families else {})
    return Advice(
        settings=asdict(settings), device=str(target.device), dtype=activation_dtype(target),
        c_target=t_costs.step, verify=verify, c_draft=c_draft,
        calibration={family.label: cal.record() for family, (_, cal) in measured.items()},
        proposers=verdicts, choice=choice, plain_tokens_per_s=plain.tokens_per_s,
        bandwidth=bandwidth_verdict(decode_bytes(target, settings.context), t_costs.step, *bandwidth, verify),
        memory={name: {"weights": weight_bytes(m), "kv_cache": kv_bytes(m, settings.context)}
                for name, m in models.items()},
        acceptance_from="saved" if saved is not None else "measured",
        confirmed=confirmed, not_ranked=NOT_RANKED | ({} if settings.round_options else QUICK),
    )


def _hybrids(c_target: float, verify: dict[int, float], overhead: float,
             measured: dict[Method, tuple[float, Calibration]], k_max: int, best_only: bool) -> list[Method]:
    """The hybrids to measure: over the best draft form by prediction, or over every one."""
    from .candidates import hybrid_of

    drafts = {f: m for f, m in measured.items() if f.uses_draft}
    if not drafts or not best_only:
        return [hybrid_of(f) for f in drafts]
    verdicts, _ = recommend(c_target, verify, overhead, drafts, k_max)
    return [hybrid_of(max(drafts, key=lambda f: verdicts[f.label].speedup or 0.0))]


def _round_options(verdicts: dict[str, Verdict], families: list[Method], saved: Advice | None) -> list[Method]:
    """The round options to calibrate: those of the best-predicted family of each kind that takes
    them, at the best k of its curve (candidates.round_variants; also where its chain does not
    pay: a tree or a stop may); from a saved run, the ones it calibrated of these families."""
    from .candidates import round_variants

    if saved is not None:
        labels = {f.label for f in families}  # a family's label names no k; a round option's does
        return [m for name in saved.calibration if (m := parse(name)).family().label in labels - {name}]
    best: dict[str, tuple[float, Method]] = {}
    for family in families:
        curve = verdicts[family.label].speedup_by_k
        if not family.uses_draft or not curve:
            continue
        k = max(curve, key=lambda k: (curve[k], -k))
        if family.kind not in best or curve[k] > best[family.kind][0]:
            best[family.kind] = curve[k], replace(family, k=k)
    return [variant for _, method in best.values() for variant in round_variants(method)]


def _context(target, tokenizer, length: int):
    """The context the costs are timed at: text, or random ids for random weights (the values
    of the context's tokens cost nothing)."""
    import torch

    from ..models.load import scored_width
    from ..prompts.long import long_prompt

    if tokenizer is None:
        ids = torch.randint(scored_width(target), (length,), generator=torch.Generator().manual_seed(0))
    else:
        ids = torch.tensor(long_prompt(tokenizer, length))
    return ids.to(target.device)


def _calibrator(target, drafts, prompts: list[list[int]], tokens: int,
                pay: Callable[[Method], PayRule | None]) -> Callable[[Method | None], Calibration]:
    """Greedy generations of a method (None: plain decoding; pay=1 stops by `pay`'s rule) on the
    calibration prompts, pooled; a hybrid's count of draft rounds goes with them (its round cost
    depends on their share)."""
    from ..decode.engine import generate
    from ..methods.build import build_proposer

    def calibrate(method: Method | None) -> Calibration:
        runs, drafted = [], 0
        for prompt in prompts:
            proposer = None if method is None else build_proposer(method, drafts, pay(method))
            runs.append(generate(target, prompt, drafter=proposer, max_new_tokens=tokens).stats)
            drafted += getattr(proposer, "draft_rounds", 0)
        hybrid = method is not None and method.kind == "hybrid"
        return Calibration.from_stats(runs, drafted if hybrid else None)

    return calibrate
