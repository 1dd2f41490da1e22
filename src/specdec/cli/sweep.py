"""`specdec sweep`: cost terms and speedup against context length (specdec.tune.sweep)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpecdecError
from ..tune.sweep import SweepSettings
from ..load.choose import choose
from ..load.loaded import to_stderr
from ..load.models import load_drafts, load_target
from .args import draft_flags, spec_of
from .flags import add_model_args
from .options import add_settings, at_least_one, ints, options, settings_of

SWEEP_ROWS_MD, SWEEP_PLOT, SWEEP_SUMMARY = "sweep.md", "sweep.png", "sweep.json"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sweep", help="cost terms and speedup against context length",
                       description="Builds real long prompts of each length, prefills them once, times the "
                       "cost terms and runs plain and speculative decoding from them.")
    add_model_args(s, "draft model of draft methods", target_quant="none")
    s.add_argument("--contexts", default="2048,4096,8192", help="comma list of context lengths (tokens)")
    s.add_argument("--methods", default="draft:k=2,lookup:k=2",
                   help="comma list of method specs: draft:k=K[:quant=Q][:vocab=N], lookup:k=K[:ngram=N]")
    add_settings(s, SweepSettings)
    s.add_argument("--ks", default="1,2,3,4,6,8,12,16", help="k values whose C_V(k) is timed")
    s.add_argument("--out", required=True, help="output folder (new or empty unless --resume)")
    s.add_argument("--resume", action="store_true", help="skip the contexts already in --out")
    s.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from tqdm import tqdm

    from ..bench.store import RowWriter, check_out_dir, read_rows
    from ..machine import environment
    from ..methods.spec import parse_list
    from ..models.load import resolve_dtype
    from ..tune.sweep import check_methods, sweep_context

    methods = parse_list(args.methods, draft_flags(args))
    check_methods(methods)
    if any(m.uses_draft for m in methods) and args.draft == "none":
        raise SpecdecError("draft methods need a draft model: drop them or pass --draft")
    at_least_one(args, *options(SweepSettings))
    if args.tokens < 2:
        raise SpecdecError(f"--tokens must be >= 2 (the first new token comes from the prefill), got {args.tokens}")
    settings = settings_of(args, SweepSettings, contexts=ints(args.contexts, "contexts"), methods=tuple(methods),
                           ks=ints(args.ks, "ks"))
    out = Path(args.out)
    dtype = resolve_dtype(args.dtype, args.device)
    labels = [m.label for m in methods]
    choices = choose(spec_of(args))
    config = {"kind": "sweep", "target": args.target,
              "draft": args.draft if any(m.uses_draft for m in methods) else None,
              "dtype": dtype, "device": args.device,
              # Contexts stay out: a resumed sweep may add lengths to a finished one.
              "settings": {k: v for k, v in asdict(settings).items() if k != "contexts"} | {"methods": labels},
              "environment": environment(args.device, dtype, labels, choices.record())}
    check_out_dir(out, config, args.resume)
    done = {row["context"] for row in read_rows(out)}
    todo = [n for n in settings.contexts if n not in done]
    if todo:
        target, tokenizer = load_target(choices, to_stderr)
        drafts = load_drafts(choices.spec, target, tokenizer, methods, reuse_caches=True)
    with RowWriter(out, config) as writer, tqdm(total=len(todo), desc="sweep", unit="context") as bar:
        for n in todo:
            writer.write(sweep_context(target, drafts, tokenizer, n, settings, progress=bar.set_postfix_str))
            bar.update()
    write_sweep_report(out)
    print(f"[sweep] {out / SWEEP_ROWS_MD}", file=sys.stderr)
    return 0


def write_sweep_report(out: Path) -> None:
    """sweep.json, sweep.md (table) and sweep.png from the folder's rows, in context order."""
    from ..bench.store import read_rows
    from ..files import write_atomic, write_json_atomic, write_text_atomic
    from ..tune.sweep import plot, render_table

    rows = sorted(read_rows(out), key=lambda r: r["context"])
    if not rows:
        return
    write_json_atomic(out / SWEEP_SUMMARY, {"rows": rows})
    write_text_atomic(out / SWEEP_ROWS_MD, render_table(rows) + "\n")
    write_atomic(out / SWEEP_PLOT, lambda tmp: plot(rows, tmp))
