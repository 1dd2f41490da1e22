"""`specdec check`: prove losslessness of speculation on a model pair (specdec.conform.check)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..conform.check import CheckPlan
from ..errors import SpecdecError
from ..load.loaded import load
from .args import method_of, spec_of
from .flags import add_method_args, add_model_args
from .options import add_settings, positive_settings, settings_of


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="prove losslessness of speculation on a model pair")
    add_model_args(c)
    add_method_args(c, default="draft")
    add_settings(c, CheckPlan)
    c.add_argument("--raw", action="store_true", help="no chat template for the greedy prompts")
    c.add_argument("--json", action="store_true")
    c.add_argument("--endpoint", metavar="NAME=URL",
                   help="check an OpenAI-compatible server instead (its speculative greedy output against "
                        "--reference's, on the built-in prompts; /v1/completions takes --target's tokenizer)")
    c.add_argument("--reference", metavar="NAME=URL", help="the server whose plain greedy output is the reference")
    c.add_argument("--tolerance", type=float, default=None, metavar="GAP",
                   help="with --endpoint: a difference where the reference's two best tokens are less than GAP "
                        "apart (log-probabilities) is a near-tie, not a failure (default: "
                        "specdec.conform.endpoints.DEFAULT_TOLERANCE)")
    c.add_argument("--endpoint-timeout", type=float, default=300.0, metavar="S",
                   help="seconds an endpoint may stay silent")
    c.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from transformers import PreTrainedModel

    from ..conform import check
    from ..external.hf import hf_greedy
    from ..models.load import eos_of
    from ..prompts.chat import encode_prompt

    if args.endpoint or args.reference:
        return cmd_check_endpoint(args)
    method = method_of(args)
    if method.kind == "ar":
        raise SpecdecError("check compares a proposer with plain decoding: use --proposer draft or lookup")
    if method.cat or method.external:
        raise SpecdecError(f"check runs specdec's proposers on the preallocated cache: not {method.label}")
    positive_settings(args, check.CheckPlan)
    plan = settings_of(args, check.CheckPlan)
    loaded = load(spec_of(args, method, args.pay_rule))  # a bad option is the only line printed
    target, tokenizer, drafter = loaded.target, loaded.tokenizer, loaded.proposer
    if drafter is None:
        raise SpecdecError("auto chose plain decoding for this setup: nothing to check; use --proposer draft or lookup")
    raw = lambda text: tokenizer(text)["input_ids"]
    start = time.perf_counter()
    # transformers' generate is a reference only for transformers' own dense model: a quantized
    # target runs specdec's layers (or specdec's native runtime), so its reference is its own plain decoding.
    dense = isinstance(target, PreTrainedModel) and loaded.choices.form.quant == "none"
    why_not = ("it runs transformers' own model; --runtime hf compares it" if not isinstance(target, PreTrainedModel)
               else "it does not run this quantized model by itself")
    print(f"[check] the reference is the {loaded.choices.record()['target']} target's own plain decoding"
          + (", and transformers' generate on the same dense model" if dense else
             f"; transformers' generate is not compared ({why_not})"),
          file=sys.stderr)
    prompts = [encode_prompt(tokenizer, t, raw=args.raw) for t in check.GREEDY_PROMPTS[: plan.greedy_prompts]]
    checks = [("greedy", lambda: check.check_greedy(target, drafter, prompts, plan.greedy_tokens))]
    if dense:
        # transformers first: specdec's first generation repacks the target's layers in place.
        eos = eos_of(target)
        hf = [hf_greedy(target, p, plan.greedy_tokens, eos)
              for p in tqdm(prompts, desc="transformers' generate", file=sys.stderr)]
        checks.append(("transformers", lambda: check.check_transformers(target, prompts, hf, plan.greedy_tokens)))
    eta = check.estimate_seconds(target, drafter, plan, raw)
    print(f"[check] estimated time: about {eta / 60:.1f} min more", file=sys.stderr)
    contexts = [raw(t) for t in check.SAMPLING_CONTEXTS]
    with tqdm(total=plan.samples * len(contexts), desc="sampling", file=sys.stderr) as bar:
        results = check.run_checks(checks + [
            ("sampling", lambda: check.check_sampling(target, drafter, contexts, plan, progress=bar.update)),
            ("invariants", lambda: check.check_invariants(target, drafter, prompts[0], plan.greedy_tokens)),
        ])
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(check.to_json(results, seconds)))
    else:
        for r in results:
            print(f"{'PASS' if r.passed else 'FAIL'}  {r.name}\n      {r.detail}")
        print(f"[check] {sum(r.passed for r in results)}/{len(results)} passed in {seconds:.0f} s")
    return 0 if all(r.passed for r in results) else 1


def cmd_check_endpoint(args: argparse.Namespace) -> int:
    """`check --endpoint A --reference B`: greedy equality of two servers (specdec.conform.endpoints)."""
    import httpx
    from tqdm import tqdm

    from ..conform import endpoints as endpoint_check
    from ..conform.check import GREEDY_PROMPTS
    from ..external.endpoints.spec import COMPLETIONS, parse_endpoints
    from ..models.load import load_tokenizer
    from ..prompts.chat import encode_prompt

    if not (args.endpoint and args.reference):
        raise SpecdecError("check a server with both --endpoint NAME=URL and --reference NAME=URL")
    candidate, reference = parse_endpoints([args.endpoint, args.reference])
    tolerance = endpoint_check.DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    texts = list(GREEDY_PROMPTS[: args.greedy_prompts])
    needs_ids = COMPLETIONS in (candidate.api, reference.api)
    tokenizer = load_tokenizer(args.target, args.trust_remote_code) if needs_ids else None
    encoded = [encode_prompt(tokenizer, t, raw=args.raw) if tokenizer else None for t in texts]
    # each prompt's ids as text too, for a completions server that takes no ids
    prompts = [(ids, t, tokenizer.decode(ids) if ids else None) for ids, t in zip(encoded, texts)]
    start = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(args.endpoint_timeout)) as client:
        served = endpoint_check.probe_both(client, candidate, reference)  # a server that is down: its error alone
        with tqdm(total=len(prompts), desc="prompts", file=sys.stderr) as bar:
            results = endpoint_check.run_check(client, candidate, reference, served, prompts, args.greedy_tokens,
                                               tolerance, progress=bar.update)
    seconds = time.perf_counter() - start
    passed = all(r.passed for r in results)
    if args.json:
        print(json.dumps(endpoint_check.to_json(results, candidate, reference, tolerance, seconds)))
    else:
        print(f"{'PASS' if passed else 'FAIL'}  {candidate.name} ({candidate.url}) against {reference.name} "
              f"({reference.url}), greedy, {len(results)} prompts x {args.greedy_tokens} tokens, "
              f"near-tie below a gap of {tolerance:g}")
        for r in results:
            print(f"      prompt {r.prompt}: {r.describe()}")
        differ = [r for r in results if r.position is not None]
        print(f"[check] {len(results) - len(differ)}/{len(results)} identical; {len(differ)} differ, "
              f"{sum(not r.passed for r in differ)} not explained by a tie ({seconds:.0f} s)")
    return 0 if passed else 1
