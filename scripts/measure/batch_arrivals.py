"""In-process, paired: the default pair's Batch under requests arriving at Poisson times, plain
against the speculative plan (and the plan without re-timing its costs), each wave run once per
variant in a rotating order, so a burst of interference on a noisy VM hits every variant alike.
No HTTP: what the batch and its plan cost, without the server's. Prints each wave's tokens per
second in all (from the wave's start to its last token) and each variant's geometric mean over
plain's. Run alone on the machine (flock):

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/batch_arrivals.py --clients 4 --gap 1.0 --limit 64
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from specdec.bench.endpoint import arrival_offsets
from specdec.cli import build_parser
from specdec.cli.args import load_proposer, method_of
from specdec.decode.batch import Batch
from specdec.decode.engine import generate
from specdec.decode.interface import runtime_of
from specdec.decode.plan import Planner, measured_plan
from specdec.decode.sequence import Options
from specdec.prompts.chat import encode_messages
from specdec.prompts.datasets import Selection, load_prompts

VARIANTS = ("plain", "spec", "spec-not-retimed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between a wave's arrivals")
    parser.add_argument("--limit", type=int, default=32, help="HumanEval prompts")
    parser.add_argument("--round-rows", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    serve = build_parser("serve").parse_args(["serve", "--target", "qwen2.5-coder-1.5b-instruct",
                                              "--draft", "qwen2.5-coder-0.5b-instruct"])
    target, tokenizer, _, drafter = load_proposer(serve, method_of(serve))
    lm = runtime_of(target, preallocate=True)
    timed = measured_plan(lm, drafter)
    print(f"costs at start: {timed}", file=sys.stderr)
    plans = {"spec": Planner(timed.verify, timed.draft, timed.catch_up, timed.measured),
             "spec-not-retimed": Planner(timed.verify, timed.draft, timed.catch_up, timed.measured)}
    plans["spec-not-retimed"].observe = lambda *reading: None
    prompts, _ = load_prompts("humaneval", Selection(limit=args.limit))
    ids = [encode_messages(tokenizer, [{"role": "user", "content": p.text}]) for p in prompts]
    generate(lm, list(range(1, 9)), drafter=drafter, max_new_tokens=4, eos_token_id=[])  # warm-up
    for model in (lm, drafter.draft_lm):
        model.release()
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i, at in enumerate(range(0, len(ids), args.clients)):
        wave = ids[at : at + args.clients]
        for variant in VARIANTS[i % len(VARIANTS):] + VARIANTS[: i % len(VARIANTS)]:
            batch = Batch(lm, None if variant == "plain" else drafter, plans.get(variant), args.round_rows)
            rates[variant].append(_wave(batch, wave, arrival_offsets(len(wave), args.gap), args.max_new_tokens))
        print(f"wave {i}: " + ", ".join(f"{v} {rates[v][-1]:.1f}" for v in VARIANTS), file=sys.stderr, flush=True)
    for variant in VARIANTS:
        ratio = np.array(rates[variant]) / np.array(rates["plain"])
        print(f"{variant}: in all median {np.median(rates[variant]):.2f} tok/s, over plain: geometric mean "
              f"{np.exp(np.log(ratio).mean()):.3f}, median {np.median(ratio):.3f}")
    print(f"spec's costs re-timed while decoding, over those at start: {plans['spec'].retimed()}")


def _wave(batch: Batch, prompts: list[list[int]], offsets: list[float], max_new_tokens: int) -> float:
    """The wave's requests added at their arrival times, the batch stepped until all end: new
    tokens in all per second from the wave's start."""
    start, pending, started = time.perf_counter(), list(zip(offsets, prompts)), []
    while pending or batch.sequences:
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            prompt = pending.pop(0)[1]
            started.append(batch.add(prompt, Options(max_new_tokens), len(prompt) + max_new_tokens + 16))
        if not batch.sequences:
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        batch.step()
    return sum(d.new for d in started) / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
