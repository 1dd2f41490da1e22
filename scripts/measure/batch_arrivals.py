"""In-process, paired: the default pair's decode scheduler under requests arriving at Poisson times, plain
against the speculative plan (and the plan without re-timing its costs, or with the draft of a
request that starts alone prefilled before its first token, as before commit ca2a37c, or taking
guesses that promise any gain over plain rows: no margin), each
wave run once per variant in a rotating order, so a burst of interference on a noisy VM hits
every variant alike.
No HTTP: what the batch and its plan cost, without the server's. Prints each wave's tokens per
second in all (from the wave's start to its last token) and its longest stall (the longest
wait of a running sequence for its next token), and each variant's geometric mean over plain's.
Run alone on the machine (flock):

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/batch_arrivals.py --clients 4 --gap 1.0 --limit 64
    flock /tmp/cpu.lock .venv/bin/python scripts/measure/batch_arrivals.py --clients 4 --gap 0 \
        --variants plain spec spec-eager
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from specdec.bench.endpoint import arrival_offsets
from specdec.decode.engine import generate
from specdec.decode.plan import Planner, measured_plan
from specdec.decode.request import Request
from specdec.decode.scheduler import Scheduler
from specdec.decode.sequence import Options
from specdec.load import LoadSpec, load
from specdec.methods.spec import parse
from specdec.prompts.chat import encode_messages
from specdec.prompts.datasets import Selection, load_prompts

VARIANTS = ("plain", "spec", "spec-not-retimed", "spec-eager", "spec-no-margin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between a wave's arrivals")
    parser.add_argument("--limit", type=int, default=32, help="HumanEval prompts")
    parser.add_argument("--round-rows", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS[:3]),
                        help="what runs each wave (plain is the base of the ratios)")
    args = parser.parse_args()
    variants = tuple(dict.fromkeys(["plain", *args.variants]))
    loaded = load(LoadSpec("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", parse("auto")))
    lm, tokenizer, drafter = loaded.lm(), loaded.tokenizer, loaded.proposer
    timed = measured_plan(lm, drafter)
    print(f"costs at start: {timed}", file=sys.stderr)
    plans = {v: Planner(timed.verify, timed.draft, timed.catch_up, timed.measured) for v in variants if v != "plain"}
    if "spec-not-retimed" in plans:
        plans["spec-not-retimed"].observe = lambda *reading: None
    if "spec-no-margin" in plans:
        plans["spec-no-margin"].margin = 0.0
    prompts, _ = load_prompts("humaneval", Selection(limit=args.limit))
    ids = [encode_messages(tokenizer, [{"role": "user", "content": p.text}]) for p in prompts]
    generate(lm, list(range(1, 9)), drafter=drafter, max_new_tokens=4, eos_token_id=[])  # warm-up
    for model in (lm, drafter.draft_lm):
        model.release()
    rates: dict[str, list[float]] = {v: [] for v in variants}
    stalls: dict[str, list[float]] = {v: [] for v in variants}
    for i, at in enumerate(range(0, len(ids), args.clients)):
        wave = ids[at : at + args.clients]
        for variant in variants[i % len(variants):] + variants[: i % len(variants)]:
            scheduler = Scheduler(lm, None if variant == "plain" else drafter, plans.get(variant), args.round_rows)
            rate, stall = _wave(scheduler, wave, arrival_offsets(len(wave), args.gap), args.max_new_tokens,
                                eager=variant == "spec-eager")
            rates[variant].append(rate)
            stalls[variant].append(stall)
        print(f"wave {i}: " + ", ".join(f"{v} {rates[v][-1]:.1f} (stall {stalls[v][-1]:.2f} s)" for v in variants),
              file=sys.stderr, flush=True)
    for variant in variants:
        ratio = np.array(rates[variant]) / np.array(rates["plain"])
        print(f"{variant}: in all median {np.median(rates[variant]):.2f} tok/s, over plain: geometric mean "
              f"{np.exp(np.log(ratio).mean()):.3f}, median {np.median(ratio):.3f}; longest stall a wave median "
              f"{np.median(stalls[variant]):.2f} s, max {max(stalls[variant]):.2f} s")
    if "spec" in plans:
        print(f"spec's costs re-timed while decoding, over those at start: {plans['spec'].retimed()}")


def _wave(scheduler: Scheduler, prompts: list[list[int]], offsets: list[float], max_new_tokens: int,
          eager: bool) -> tuple[float, float]:
    """The wave's requests added at their arrival times, the scheduler stepped until all end: new
    tokens in all per second from the wave's start, and the longest a sequence that had its
    first token waited for its next. `eager`: the scheduler as it was before commit ca2a37c, a
    sequence that starts alone has its draft read the whole prompt before its first round (the
    plan then never sees a catch-up for it)."""
    start, pending, requests = time.perf_counter(), list(zip(offsets, prompts)), []
    alone: list[Request] = []
    scheduler.on_start = lambda request, first: alone.append(request) if first else None
    last: dict = {}  # request -> (tokens, when they last grew)
    stall = 0.0

    def seen() -> float:
        now, longest = time.perf_counter(), 0.0
        for r in requests:
            got, at = (r.decoding.new if r.decoding is not None else 0), last.get(r, (0, now))
            if got > at[0]:
                longest = max(longest, now - at[1]) if at[0] else longest
                last[r] = (got, now)
        return longest

    while pending or not scheduler.idle:
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            requests.append(scheduler.add(pending.pop(0)[1], Options(max_new_tokens)))
        if scheduler.idle:
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        scheduler.admit()
        for r in [r for r in alone if r.decoding in scheduler.batch.running]:  # its prompt forwarded
            if eager and r.decoding.draft_lm is not None:
                r.decoding.draft_lm.forward(r.decoding.prompt[r.decoding.draft_lm.length :], last_only=True)
            alone.remove(r)
        stall = max(stall, seen())
        scheduler.round()
        stall = max(stall, seen())
    return sum(r.decoding.new for r in requests) / (time.perf_counter() - start), stall


if __name__ == "__main__":
    main()
