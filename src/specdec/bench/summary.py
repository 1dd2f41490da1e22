"""Benchmark rows -> summary: throughput, paired speedup over `ar` with bootstrap intervals,
acceptance, greedy equality and the cost model's prediction, overall and per category.

Reads only the rows (and the run's config); knows nothing about models or engines."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from ..decode.stats import GenerationStats
from ..methods.spec import Method, legacy, parse
from .agreement import REFERENCE, agreement
from .equality import greedy_equality
from .prediction import prediction, time_per_token
from .row import engine_stats
from .served import server_acceptance

BASELINE = "ar"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0

NOTES = {
    "tokens_per_s": "decode throughput of one run: tokens after the first chunk / time after it "
    "(prefill excluded; the first chunk is the prefill's token, or for HF speculative methods the "
    "first round, which transformers runs together with the prefill)",
    "speedup": "per prompt: the method's tokens_per_s over ar's on the same prompt and repeat, "
    "geometric mean over repeats; median, quartiles and geometric mean over prompts; 95% intervals "
    f"from {BOOTSTRAP_RESAMPLES} bootstrap resamples of the prompts (seed {BOOTSTRAP_SEED})",
    "mean_accepted_length": "tokens committed per target call in decode rounds, the target's own "
    "token included: (accepted + rounds) / rounds over all runs; for HF methods the sizes of the "
    "streamer's chunks after the first",
    "acceptance_rate": "accepted / proposed draft tokens over all runs (specdec methods only)",
    "position_acceptance": "[i]: P(guess i+1 accepted | guesses 1..i accepted and guess i+1 "
    "proposed), over all decode rounds of all runs",
    "accept_length_histogram": "[a]: decode rounds that accepted a guesses (rounds that proposed "
    "nothing count at a=0; rounds_without_proposal says how many)",
    "time_per_token_s": "seconds per decode token: each phase's total time over all decode tokens",
    "greedy_equal": "greedy runs only: prompts whose tokens differ from ar's (specdec's plain decoding) in "
    "any repeat, compared bit for bit with no tolerance; an endpoint against its --baseline endpoint, by "
    "token ids where both servers name them (logprobs), else by text",
    "endpoints": "endpoint:name=NAME rows come from an OpenAI-compatible server, streamed: prefill_s is the "
    "time to the first token, tokens/s counts the tokens after the first chunk over the time from it to the "
    "last; acceptance is what the server reports (llama.cpp: timings.draft_n_accepted / draft_n per request; "
    "vLLM: its /metrics counters read before and after each request or concurrent wave); speedups are over "
    "the endpoint's --baseline endpoint (the report's header names it) on the same prompt and repeat",
    "aggregate_tokens_per_s": "endpoints: per wave of --concurrency requests sent at once (or with --arrival-gap "
    "one after another, at the same Poisson times for every endpoint), all their new tokens over the wave's wall "
    "time, from its start to the last stream's end (prefills included; with --concurrency 1 a request's own "
    "end-to-end rate); quartiles over rows, each row carrying its wave's figure",
    "aggregate_decode_tokens_per_s": "endpoints: per wave, all its requests' decode tokens (after each one's first "
    "chunk) over the time during which at least one of them was decoding (the union of their spans from first to last "
    "token): prefills that ran while no request decoded are left out, those that stalled others' decoding are in; a "
    "server that serves the wave one request after another gets one request's rate; quartiles over rows, each row "
    "carrying its wave's figure",
    "stall_s": "endpoints: each stream's longest wait between two chunks of tokens after its first (where other "
    "requests' prefills stall it), percentiles over all runs",
    "ttft_s": "time to first token per request (for specdec's own methods: their prefill), percentiles over all runs "
    "(numpy's linear interpolation: with few runs p99 is close to the slowest)",
    "hf_agreement": "greedy runs with hf-ar only: prompts equal to transformers' plain generate() (run on an "
    "unmodified copy of the target) in every repeat; each difference with the target's top-1/top-2 logit "
    "gap at its first differing token (specdec's forward of the common prefix): an exact tie, a near-tie "
    "(below conformance.NEAR_TIE_TOLERANCE for the dtype: other kernels round differently) or not a tie",
    "prediction": "costmodel.predicted_speedup fed with this group's measurements: C_T(1) = ar's "
    "verify time per decode round (one target call each); baseline overhead = ar's propose+accept+"
    "other time per round; C_D (shown) = the draft method's propose time per decode draft call (the "
    "draft's prefill call is excluded), or for lookup its propose time per round / k; the model, "
    "which charges k*C_D a round, is fed the propose time per round / k, so methods whose rounds "
    "guess fewer than k (adaptive k, lookup without a match) are charged what they spent; C_V(k) = the method's "
    "verify time per round, measured at its mean block size (mean_block_size, which for lookup is "
    "below k+1); C_O = accept+other time per round (trims are timed inside the accept "
    "phase); rates r_i over all rounds, a round proposing fewer than i tokens counting as a "
    "rejection at i, so E[tokens per round] equals the measured mean accepted length. Built this "
    "way the model reproduces the ratio of total throughputs; its error against the measured "
    "geometric-mean speedup shows how far per-prompt variation and truncation at max_new_tokens/EOS "
    "move the answer",
}


def config_methods(config: dict) -> dict[str, Method]:
    """A run's methods by the label its rows carry: full specs, or in configs written before
    the one grammar, dicts (method.legacy)."""
    return {m: parse(m) for m in config["methods"]} if all(isinstance(m, str) for m in config["methods"]) else {
        m["label"]: legacy(m) for m in config["methods"]}


def summarize(rows: list[dict], config: dict, differences: dict | None = None) -> dict:
    """The summary.json content for `rows` of a run with `config`; `differences` explains the
    rows that differ from hf-ar's (bench.agreement)."""
    methods = config_methods(config)
    order = list(methods)
    greedy = config["sampling"]["temperature"] == 0
    categories = list(dict.fromkeys(r["category"] for r in rows))
    return {
        "config": config,
        "notes": NOTES,
        "overall": summarize_group(rows, order, methods, greedy, differences or {}, endpoint_baselines(config)),
        "categories": {
            c: summarize_group([r for r in rows if r["category"] == c], order, methods, greedy, differences or {},
                               endpoint_baselines(config))
            for c in categories
        },
    }


def endpoint_baselines(config: dict) -> dict[str, str]:
    """{endpoint label: its baseline endpoint's label} of a run (bench's --baseline); runs from
    before an endpoint could have its own baseline name one, for every endpoint."""
    if "baselines" in config:
        return config["baselines"]
    one = config.get("baseline")
    return {label: one for label, m in config_methods(config).items() if m.is_endpoint} if one else {}


def baseline_of(label: str, method: Method, baselines: dict[str, str]) -> str:
    """What a method's speedup and equality are measured against: `ar` for specdec's own
    methods, the endpoint's --baseline endpoint for endpoints (servers are compared with servers)."""
    return baselines.get(label, BASELINE) if method.is_endpoint else BASELINE


def summarize_group(rows: list[dict], order: list[str], methods: dict[str, Method], greedy: bool,
                    differences: dict, baselines: dict[str, str] | None = None) -> dict:
    by_method = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    reference = by_method.get(REFERENCE, []) if greedy else []
    return {
        "n_prompts": len({r["prompt_id"] for r in rows}),
        "methods": {
            label: {
                **summarize_method(by_method[label], label, methods[label],
                                   by_method.get(baseline_of(label, methods[label], baselines or {}), []), greedy,
                                   differences),
                "hf_agreement": agreement(by_method[label], reference, differences)
                if reference and label != REFERENCE and not methods[label].is_endpoint else None,
            }
            for label in order
            if by_method[label]
        },
    }


def summarize_method(rows: list[dict], label: str, method: Method, baseline: list[dict], greedy: bool,
                     differences: dict | None = None) -> dict:
    is_baseline = bool(baseline) and baseline[0]["method"] == label
    speedup = None if is_baseline or not baseline else speedup_summary(paired_speedups(rows, baseline))
    return {
        "kind": method.kind,
        "k": method.k,
        "runs": len(rows),
        "tokens_per_s": quartiles([r["tokens_per_s"] for r in rows if r["tokens_per_s"]]),
        "prefill_s": quartiles([r["prefill_s"] for r in rows]),
        "prefill_tokens_per_s": quartiles([r["prefill_tokens_per_s"] for r in rows if r.get("prefill_tokens_per_s")]),
        "ttft_s": percentiles([r["prefill_s"] for r in rows]),
        "stall_s": percentiles([r["stall_s"] for r in rows if r.get("stall_s") is not None]),
        "mean_new_tokens": float(np.mean([r["n_new"] for r in rows])),
        "speedup": speedup,
        **acceptance_summary(rows),
        "time_per_token_s": time_per_token(rows),
        "greedy_equal": greedy_equality(rows, baseline, differences if method.is_endpoint else None)
        if greedy and baseline and not is_baseline else None,
        "prediction": prediction(rows, baseline, method, speedup) if method.speculative and speedup else None,
        # an endpoint's throughput under load: each wave's new tokens over its wall time (prefills included)
        "aggregate_tokens_per_s": quartiles([r["wave_tokens"] / r["wave_s"] for r in rows if r.get("wave_s")]),
        # ... and its decode rate in all: decode tokens over the time any of the wave's requests was decoding
        "aggregate_decode_tokens_per_s": quartiles([r["wave_decode_tokens"] / r["wave_decode_s"] for r in rows
                                                    if r.get("wave_decode_s")]),
        "peak_memory_bytes": max((r["peak_memory_bytes"] for r in rows if r["peak_memory_bytes"] is not None),
                                 default=None),
    }


def quartiles(values) -> dict | None:
    if len(values) == 0:
        return None
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3), "n": len(values)}


TTFT_PERCENTILES = (50, 90, 99)


def percentiles(values, ps=TTFT_PERCENTILES) -> dict | None:
    """{"p50": ..., "p90": ..., "p99": ..., "max": ..., "n": ...} of `values` (numpy's linear interpolation)."""
    if len(values) == 0:
        return None
    return {**{f"p{p}": float(v) for p, v in zip(ps, np.percentile(values, ps))}, "max": float(np.max(values)),
            "n": len(values)}


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


def paired_speedups(rows: list[dict], baseline: list[dict]) -> dict[str, float]:
    """Per prompt: tokens/s over the baseline's on the same prompt and repeat, geometric mean over
    repeats. Pairs where either side has no decode throughput (one token, EOS first) are skipped."""
    base = {(r["prompt_id"], r["repeat"]): r["tokens_per_s"] for r in baseline}
    ratios = defaultdict(list)
    for r in rows:
        other = base.get((r["prompt_id"], r["repeat"]))
        if r["tokens_per_s"] and other:
            ratios[r["prompt_id"]].append(r["tokens_per_s"] / other)
    return {prompt: geomean(values) for prompt, values in ratios.items()}


def speedup_summary(per_prompt: dict[str, float]) -> dict | None:
    if not per_prompt:
        return None
    values = np.array(list(per_prompt.values()))
    return {
        **quartiles(values),
        "geomean": geomean(values),
        "ci95_median": bootstrap_ci(values, lambda x: np.median(x, axis=1)),
        "ci95_geomean": bootstrap_ci(values, lambda x: np.exp(np.mean(np.log(x), axis=1))),
        "per_prompt": per_prompt,
    }


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> list[float]:
    """Percentile 95% interval of `statistic` (applied along axis 1 of a resamples x n array)
    over resamples of the prompts with replacement; a fixed seed makes reruns agree."""
    rng = np.random.default_rng(seed)
    samples = values[rng.integers(0, len(values), size=(resamples, len(values)))]
    lo, hi = np.percentile(statistic(samples), [2.5, 97.5])
    return [float(lo), float(hi)]


def acceptance_summary(rows: list[dict]) -> dict:
    engine = [engine_stats(r) for r in rows]
    if engine[0] is not None:
        return _engine_acceptance(GenerationStats.pooled(engine))
    if any(r.get("accept_source") for r in rows):
        return server_acceptance(rows)
    if rows[0]["round_tokens"] is None:  # llama.cpp, endpoints without counts: no rounds to count
        return {"accept_source": None, "rounds": None, "mean_accepted_length": None, "acceptance_rate": None,
                "position_acceptance": None, "accept_length_histogram": [], "rounds_without_proposal": None}
    # HF methods: each streamer chunk after the first is one target call's committed tokens.
    committed = [t for r in rows for t in r["round_tokens"][1:]]
    return {
        "accept_source": "hf streamer chunks",
        "rounds": len(committed),
        "mean_accepted_length": float(np.mean(committed)) if committed else None,
        "acceptance_rate": None,
        "position_acceptance": None,
        "accept_length_histogram": np.bincount(np.array(committed, dtype=int) - 1).tolist() if committed else [],
        "rounds_without_proposal": None,
    }


def _engine_acceptance(s: GenerationStats) -> dict:
    """The engine's figures of a method's runs, pooled (its record's, None where nothing was counted)."""
    return {
        "accept_source": "engine",
        "rounds": s.rounds,
        "mean_accepted_length": s.mean_accepted_length if s.rounds else None,
        "acceptance_rate": s.acceptance_rate if s.proposed else None,
        "position_acceptance": s.position_acceptance,
        "accept_length_histogram": s.accept_length_histogram,
        "rounds_without_proposal": s.rounds_without_proposal,
    }
