"""Command line: specdec generate | check | bench | sweep | advise."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .errors import SpecdecError

# Measured on the 2-core Xeon (docs/generate.md): a verify block of 2-3 rows (k <= 2) costs ~1.1
# target steps, 4-6 rows ~1.9, so k=2 pays best there (1.41x against 1.15x for k=3 on code).
DEFAULT_K = {"draft": 2, "lookup": 2, "hybrid": 2}


def add_models_args(p: argparse.ArgumentParser, draft_help: str = "draft model for --proposer draft") -> None:
    """The target, the draft and how to load them: shared by every command."""
    from .models import DEFAULT_DRAFT, DEFAULT_TARGET, DTYPES

    p.add_argument("--target", default=DEFAULT_TARGET, help="registry name or local HF model folder")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=draft_help)
    p.add_argument("--draft-int8", action="store_true",
                   help="int8 weights for the draft's linear layers (CPU): a cheaper draft, still lossless")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the draft scores only the N most frequent token ids (e.g. 32768): a cheaper "
                        "draft step, still lossless")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="auto: bfloat16 where the hardware has it natively, else float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a local model folder to run its own Python code")


def add_model_args(p: argparse.ArgumentParser, default_proposer: str = "draft") -> None:
    add_models_args(p)
    p.add_argument("--proposer", choices=["auto", "draft", "lookup", "hybrid", "none"], default=default_proposer,
                   help="auto: what `specdec advise` measured best for this target, draft and machine "
                        "(plain decoding where speculation does not pay); hybrid: prompt lookup when an "
                        "n-gram matches, the draft model otherwise")
    p.add_argument("-k", type=int, default=None, help="tokens proposed per round (default 2)")
    p.add_argument("--max-ngram", type=int, default=3, help="longest n-gram prompt lookup matches")
    p.add_argument("--tree-width", type=int, default=1, metavar="W",
                   help="tree speculation: beside each draft guess, its W-1 next most likely tokens as "
                        "alternatives, all verified in one target forward (1 = a plain chain)")
    p.add_argument("--min-confidence", type=float, default=0.0,
                   help="adaptive k: a round stops guessing after a draft probability below this")
    p.add_argument("--pay-rule", metavar="FILE",
                   help="adaptive k by the cost model: a round stops guessing when one more guess is not "
                        "expected to pay, judged from the cost terms in FILE (the JSON of `specdec advise "
                        "--json` for this pair); -k is then the most a round guesses")


def load_draft(args: argparse.Namespace, target, tokenizer):
    """The draft model of --draft, checked against the target's vocabulary, made cheaper as asked."""
    from .draft_head import cheaper_draft
    from .models import check_same_vocab, load_model

    draft, draft_tokenizer = load_model(args.draft, args.dtype, args.device, args.trust_remote_code)
    check_same_vocab(tokenizer, draft_tokenizer, target, draft)
    return cheaper_draft(draft, tokenizer, vocab=args.draft_vocab, int8=args.draft_int8)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)


def load_pair(args: argparse.Namespace):
    """Target model and tokenizer, and the proposer the arguments ask for (None for plain)."""
    from .adaptive import PayRule
    from .models import load_model
    from .proposers import DraftModel, Hybrid, PromptLookup, TreeDraft

    auto = args.proposer == "auto"
    if auto:
        args, chosen = resolve_auto(args)
    k = args.k if args.k is not None else DEFAULT_K.get(args.proposer, 1)
    if k < 1:
        raise SpecdecError(f"-k must be >= 1, got {k}")
    target, tokenizer = load_model(args.target, args.dtype, args.device, args.trust_remote_code)
    if auto:  # said once the target is known to load, so a bad name still gives a one-line error
        print(f"[specdec] auto: {chosen}", file=sys.stderr)
    if args.proposer == "none":
        return target, tokenizer, None
    if args.proposer == "lookup":
        return target, tokenizer, PromptLookup(k, max_ngram=args.max_ngram)
    rule = PayRule.from_advice(args.pay_rule, args.draft_int8, k) if args.pay_rule else None
    draft = DraftModel(load_draft(args, target, tokenizer), k, args.min_confidence, rule)
    if args.proposer == "hybrid":
        return target, tokenizer, Hybrid(draft, PromptLookup(k, max_ngram=args.max_ngram))
    return target, tokenizer, TreeDraft(draft, width=args.tree_width) if args.tree_width != 1 else draft


def resolve_auto(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    """The arguments with --proposer auto replaced by the saved advice (or the default), and
    a line saying what was chosen and why; an explicit -k or --draft-int8 still wins."""
    from .auto import Setup, choose

    choice = choose(Setup.from_args(args))
    proposer = "draft" if choice.proposer == "draft-int8" else choice.proposer
    k = args.k if args.k is not None else max(choice.k, 1)  # "none" carries k=0
    int8 = args.draft_int8 or choice.proposer == "draft-int8"
    shown = "plain decoding" if proposer == "none" else f"{choice.proposer} k={k}"
    return argparse.Namespace(**{**vars(args), "proposer": proposer, "k": k, "draft_int8": int8}), f"{shown} ({choice.why})"


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import GenerationInterrupted, generate
    from .prompts import encode_prompt, require_text
    from .stream import Streamer

    text = require_text(_prompt_text(args))
    if args.max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    target, tokenizer, drafter = load_pair(args)
    prompt = encode_prompt(tokenizer, text, raw=args.raw)
    streamer = None if args.json else Streamer(tokenizer, color=_use_color(args.color))
    code = 0
    try:
        result = generate(
            target, prompt, drafter=drafter, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
            on_commit=streamer.on_commit if streamer else None,
        )
    except GenerationInterrupted as interrupt:  # Ctrl-C: still show what was committed
        result, code = interrupt.result, 130
    if args.json:
        print(json.dumps(_json_result(tokenizer, result)))
    else:
        streamer.finish()
        print(summary_line(result), file=sys.stderr)
    return code


def cmd_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from . import check
    from .prompts import encode_prompt

    if args.proposer == "none":
        raise SpecdecError("check compares a proposer with plain decoding: use --proposer draft or lookup")
    plan = check.CheckPlan(greedy_prompts=args.prompts, greedy_tokens=args.tokens, samples=args.samples,
                           top_k=args.sample_top_k)
    target, tokenizer, drafter = load_pair(args)
    if drafter is None:
        raise SpecdecError("auto chose plain decoding for this setup: nothing to check; use --proposer draft or lookup")
    raw = lambda text: tokenizer(text)["input_ids"]
    start = time.perf_counter()
    eta = check.estimate_seconds(target, drafter, plan, raw)
    print(f"[check] estimated time: about {eta / 60:.1f} min", file=sys.stderr)
    prompts = [encode_prompt(tokenizer, t, raw=args.raw) for t in check.GREEDY_PROMPTS[: plan.greedy_prompts]]
    contexts = [raw(t) for t in check.SAMPLING_CONTEXTS]
    with tqdm(total=plan.samples * len(contexts), desc="sampling", file=sys.stderr) as bar:
        results = check.run_checks([
            ("greedy", lambda: check.check_greedy(target, drafter, prompts, plan.greedy_tokens)),
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


def _json_result(tokenizer, result) -> dict:
    return {
        "text": tokenizer.decode(result.new_tokens, skip_special_tokens=True),
        "new_tokens": result.new_tokens,
        "finish_reason": result.finish_reason,
        "stats": result.stats.to_dict(),
    }


def summary_line(result) -> str:
    s = result.stats
    t = s.times
    spec = (f"; {s.rounds} rounds, mean accepted length {s.mean_accepted_length:.2f} "
            f"(acceptance {100 * s.acceptance_rate:.0f}% of {s.proposed} proposed), "
            f"draft calls {s.draft_calls}") if s.proposed else ""
    return (f"[specdec] {s.new_tokens} tokens ({result.finish_reason}), decode {s.tokens_per_s:.2f} tok/s, "
            f"target calls {s.target_calls}{spec}; prefill {t['prefill']:.2f}s, propose "
            f"{t['propose']:.2f}s, verify {t['verify']:.2f}s, accept {t['accept']:.2f}s")


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        return args.prompt
    try:
        return Path(args.prompt_file).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecdecError(f"cannot read --prompt-file {args.prompt_file}: {e.strerror}") from None


def _use_color(choice: str) -> bool:
    return choice == "always" or (choice == "auto" and sys.stdout.isatty())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text, speculatively, with live acceptance")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    add_model_args(g, default_proposer="auto")
    add_sampling_args(g)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="green: tokens the proposer guessed; plain: tokens from the target")
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("check", help="prove losslessness of speculation on a model pair")
    add_model_args(c)
    c.add_argument("--prompts", type=int, default=4, help="greedy prompts (built-in, several languages)")
    c.add_argument("--tokens", type=int, default=32, help="new tokens per greedy prompt")
    c.add_argument("--samples", type=int, default=100, help="sampled generations per context")
    c.add_argument("--sample-top-k", type=int, default=3, help="top-k for the sampling check (few cells)")
    c.add_argument("--raw", action="store_true", help="no chat template for the greedy prompts")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check)
    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Sub-commands that live in their own modules register themselves here."""
    from .bench import register as bench
    from .measure_cli import register as measure

    return [bench, measure]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
