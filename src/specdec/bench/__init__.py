"""`specdec bench`, the paired benchmark, and `specdec report DIR`, which rebuilds its summary
and report. The parsers live here; the work is imported only when a command runs."""

from __future__ import annotations

import argparse

from ..cli import add_models_args, add_sampling_args

METHODS_HELP = (
    "comma list of methods, options after colons: ar[:cat=1], auto, draft:k=K[:conf=P][:pay=1][:vocab=N][:width=W], "
    "draft-int8 (same options), "
    "lookup:k=K:ngram=N, "
    "hybrid:k=K:ngram=N, hf-ar, "
    "hf-assisted:k=K, hf-lookup:k=K:ngram=N (k defaults to 3, ngram to --max-ngram); "
    "cat=1 on any specdec method: transformers' concatenating KV cache instead of the preallocated one"
)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="paired benchmark of decoding methods over a dataset",
        description="Runs every method on every prompt, interleaved, and writes config.json, "
        "results.jsonl (one row per run), summary.json and report.md with plots into --out.",
    )
    b.add_argument("--dataset", required=True, help="humaneval, mt-bench, spec-bench (bundled), or a JSONL file (turns or prompt field)")
    b.add_argument("--categories", help="comma list: keep only these categories")
    b.add_argument("--per-category", type=int, help="keep the first N prompts of each category")
    b.add_argument("--limit", type=int, help="keep the first N prompts (after the filters above)")
    b.add_argument("--methods", default="ar,draft,lookup", help=METHODS_HELP)
    b.add_argument("--max-ngram", type=int, default=3, help="default ngram of lookup methods")
    b.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt")
    b.add_argument("--out", required=True, help="output folder (must be new or empty unless --resume)")
    b.add_argument("--resume", action="store_true", help="continue a run in --out, skipping finished rows")
    b.add_argument("--raw", action="store_true", help="do not apply the chat template")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--pay-rule", metavar="FILE",
                   help="cost terms for methods with pay=1: the JSON of `specdec advise --json` for this pair")
    add_models_args(b, "draft model of draft and hf-assisted methods")
    add_sampling_args(b)
    b.set_defaults(func=_bench)

    r = sub.add_parser("report", help="rebuild summary.json and report.md of a bench folder from its rows")
    r.add_argument("dir", help="a folder written by specdec bench")
    r.set_defaults(func=_report)


def _bench(args: argparse.Namespace) -> int:
    from .command import cmd_bench

    return cmd_bench(args)


def _report(args: argparse.Namespace) -> int:
    from .command import cmd_report

    return cmd_report(args)
