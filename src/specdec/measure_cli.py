"""`specdec advise` and `specdec sweep`: the commands that measure the cost model's terms.
Parsers only at import time; models and torch load when a command runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import SpecdecError

SWEEP_ROWS_MD, SWEEP_PLOT, SWEEP_SUMMARY = "sweep.md", "sweep.png", "sweep.json"


def register(sub: argparse._SubParsersAction) -> None:
    from .cli import add_models_args

    model_args = lambda p: add_models_args(p, "draft model; 'none' measures prompt lookup only")

    a = sub.add_parser("advise", help="measure the cost terms here and recommend a proposer and k",
                       description="Times C_T(1), C_D and C_V(k), measures acceptance by position on "
                       "calibration prompts, and predicts the speedup of each proposer and k.")
    model_args(a)
    a.add_argument("--context", type=int, default=512, help="context length (tokens) the costs are timed at")
    a.add_argument("--k-max", type=int, default=16, help="largest k to time and consider")
    a.add_argument("--calibration-k", type=int, default=6, help="guesses per round while measuring acceptance")
    a.add_argument("--dataset", default="spec-bench", help="calibration prompts: a bench dataset name or JSONL")
    a.add_argument("--categories", default="coding,writing,math_reasoning,summarization",
                   help="categories to take one prompt each from ('' = the first prompts of the file)")
    a.add_argument("--prompts", type=int, default=4, help="calibration prompts")
    a.add_argument("--tokens", type=int, default=48, help="new tokens per calibration prompt")
    a.add_argument("--raw", action="store_true", help="no chat template")
    a.add_argument("--json", action="store_true", help="print the report as one JSON object")
    a.add_argument("--random-weights", action="store_true",
                   help="time models of the target's and draft's shapes with random weights (no weights "
                        "needed here); acceptance then comes from --acceptance")
    a.add_argument("--acceptance", metavar="FILE",
                   help="take each proposer's acceptance from this `advise --json` output of a run where "
                        "the real weights are, and measure only the costs here")
    a.set_defaults(func=cmd_advise)

    s = sub.add_parser("sweep", help="cost terms and speedup against context length",
                       description="Builds real long prompts of each length, prefills them once, times the "
                       "cost terms and runs plain and speculative decoding from them.")
    model_args(s)
    s.add_argument("--contexts", default="2048,4096,8192", help="comma list of context lengths (tokens)")
    s.add_argument("--methods", default="draft:k=2,lookup:k=2", help="comma list: draft:k=K, lookup:k=K")
    s.add_argument("--tokens", type=int, default=32, help="new tokens per generation")
    s.add_argument("--repeats", type=int, default=2, help="generations per method and context (after a warm-up)")
    s.add_argument("--ks", default="1,2,3,4,6,8,12,16", help="k values whose C_V(k) is timed")
    s.add_argument("--out", required=True, help="output folder (new or empty unless --resume)")
    s.add_argument("--resume", action="store_true", help="skip the contexts already in --out")
    s.set_defaults(func=cmd_sweep)


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecdecError(f"--{name} takes a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecdecError(f"--{name} needs positive integers, got {text!r}")
    return values


def _load(args: argparse.Namespace):
    from .cli import load_draft
    from .models import load_model

    target, tokenizer = load_model(args.target, args.dtype, args.device, args.trust_remote_code)
    draft = None if args.draft == "none" else load_draft(args, target, tokenizer)
    return target, draft, tokenizer


def _load_random(args: argparse.Namespace):
    """Random-weight models of the target's and the draft's shapes, and no tokenizer."""
    from .models import random_model
    from .quantize import int8_draft

    if args.draft_vocab:
        raise SpecdecError("--draft-vocab counts token frequencies with the tokenizer: not with --random-weights")
    target = random_model(args.target, args.dtype, args.device)
    draft = None if args.draft == "none" else random_model(args.draft, args.dtype, args.device)
    return target, int8_draft(draft) if draft is not None and args.draft_int8 else draft, None


def cmd_advise(args: argparse.Namespace) -> int:
    import torch

    from .advise import AdviseSettings, render, run_advise
    from .bench.store import read_json
    from .lm import logit_width
    from .auto import Setup, save_advice
    from .bench.datasets import Selection, load_prompts
    from .prompts import encode_prompt

    for name in ("context", "k_max", "calibration_k", "prompts", "tokens"):
        if getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.random_weights and not args.acceptance:
        raise SpecdecError("random weights cannot measure acceptance: add --acceptance FILE, the output of "
                           "`specdec advise --json` run where the real weights are")
    saved = read_json(Path(args.acceptance)) if args.acceptance else None
    categories = tuple(c for c in args.categories.split(",") if c) or None
    prompts, _ = load_prompts(args.dataset, Selection(categories, 1 if categories else None, args.prompts))
    target, draft, tokenizer = _load_random(args) if args.random_weights else _load(args)
    if tokenizer is None:  # only plain decoding's bookkeeping is timed on these: any ids do
        gen = torch.Generator().manual_seed(0)
        encoded = [torch.randint(logit_width(target), (32,), generator=gen).tolist() for _ in prompts]
    else:
        encoded = [encode_prompt(tokenizer, p.text, raw=args.raw) for p in prompts]
    settings = AdviseSettings(args.context, args.k_max, args.calibration_k, len(prompts), args.tokens)
    say = lambda step: print(f"[advise] {step}", file=sys.stderr, flush=True)
    report = run_advise(target, draft, tokenizer, settings, encoded, progress=say, saved=saved)
    report["calibration_prompts"] = [p.id for p in prompts] if saved is None else f"from {args.acceptance}"
    report["random_weights"] = args.random_weights
    print(json.dumps(report, indent=1) if args.json else render(report))
    saved = save_advice(Setup.from_args(args), report)
    print(f"[advise] saved for `specdec generate --proposer auto`: {saved}", file=sys.stderr)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .bench.store import RowWriter, check_out_dir, read_rows
    from .models import resolve_dtype
    from .sweep import SweepSettings, parse_method, sweep_context

    methods = tuple(m for m in args.methods.split(",") if m)
    for m in methods:
        parse_method(m)
    if any(m.startswith("draft") for m in methods) and args.draft == "none":
        raise SpecdecError("draft methods need a draft model: drop them or pass --draft")
    settings = SweepSettings(_ints(args.contexts, "contexts"), methods, args.tokens, args.repeats,
                             _ints(args.ks, "ks"))
    if settings.tokens < 2 or settings.repeats < 1:
        raise SpecdecError("--tokens must be >= 2 and --repeats >= 1")
    out = Path(args.out)
    config = {"kind": "sweep", "target": args.target, "draft": args.draft,
              "dtype": resolve_dtype(args.dtype, args.device), "device": args.device,
              # Contexts stay out: a resumed sweep may add lengths to a finished one.
              "settings": {k: v for k, v in settings.__dict__.items() if k != "contexts"}}
    check_out_dir(out, config, args.resume)
    done = {row["context"] for row in read_rows(out)}
    todo = [n for n in settings.contexts if n not in done]
    target, draft, tokenizer = _load(args) if todo else (None, None, None)
    with RowWriter(out, config) as writer, tqdm(total=len(todo), desc="sweep", unit="context") as bar:
        for n in todo:
            writer.write(sweep_context(target, draft, tokenizer, n, settings, progress=bar.set_postfix_str))
            bar.update()
    write_sweep_report(out)
    print(f"[sweep] {out / SWEEP_ROWS_MD}", file=sys.stderr)
    return 0


def write_sweep_report(out: Path) -> None:
    """sweep.json, sweep.md (table) and sweep.png from the folder's rows, in context order."""
    from .bench.store import read_rows, write_atomic, write_json_atomic, write_text_atomic
    from .sweep import plot, render_table

    rows = sorted(read_rows(out), key=lambda r: r["context"])
    if not rows:
        return
    write_json_atomic(out / SWEEP_SUMMARY, {"rows": rows})
    write_text_atomic(out / SWEEP_ROWS_MD, render_table(rows) + "\n")
    write_atomic(out / SWEEP_PLOT, lambda tmp: plot(rows, tmp))
