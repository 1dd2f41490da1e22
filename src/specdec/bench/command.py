"""The bench and report commands: arguments -> configuration -> runs -> summary -> report."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from ..auto import Setup, choose
from ..cli import DEFAULT_K, load_draft
from ..errors import SpecdecError
from ..measure import device_name
from ..models import load_model, resolve_dtype
from ..prompts import encode_prompt
from ..report import REPORT, write_report
from ..sampling import SamplingConfig
from .datasets import Prompt, Selection, file_sha256, load_prompts
from .execute import WARMUP_TOKENS, Executor, RunSettings, eos_token_ids
from .memory import KINDS, PeakMemory
from .methods import Method, parse_methods, resolve_auto
from .runner import EncodedPrompt, run_bench
from .store import CONFIG, RESULTS, SUMMARY, check_out_dir, read_json, read_rows, write_json_atomic
from .summary import summarize


def cmd_bench(args: argparse.Namespace) -> int:
    methods = parse_methods(args.methods, DEFAULT_K, args.max_ngram)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)  # validates them
    for name in ("repeats", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    selection = Selection(_split(args.categories), args.per_category, args.limit)
    prompts, path = load_prompts(args.dataset, selection)
    out = Path(args.out)
    memory = PeakMemory(torch.device(args.device))
    # `auto` is resolved once, before anything runs; the choice is part of the configuration.
    choice = choose(Setup.from_args(args)) if any(m.kind == "auto" for m in methods) else None
    auto = resolve_auto(choice, args.max_ngram) if choice else None
    config = bench_config(args, methods, prompts, path, memory.kind, auto)
    if choice:
        config["auto"] = {"runs": auto.label, "why": choice.why}
    # Checked before the models load (slow), so a refused folder is refused at once.
    check_out_dir(out, config, args.resume)

    target, tokenizer = load_model(args.target, args.dtype, args.device, args.trust_remote_code)
    draft = load_draft(args, target, tokenizer) if _needs_draft(methods, auto) else None
    encoded = [EncodedPrompt(p, encode_prompt(tokenizer, p.text, raw=args.raw)) for p in prompts]
    settings = RunSettings(args.max_new_tokens, sampling, args.seed, eos_token_ids(target))
    executor = Executor(target, draft, settings, memory, tokenizer, auto, args.pay_rule)
    executor.prepare(methods)
    try:
        run_bench(out, config, encoded, methods, args.repeats, executor,
                  progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\nspecdec: interrupted; the {len(read_rows(out))} finished rows are kept in {out / RESULTS}.\n"
              f"resume with: {_resume_command()}", file=sys.stderr)
        return 130
    print(_digest(report_folder(out)) + f"\nreport: {out / REPORT}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    if not (out / CONFIG).is_file():
        raise SpecdecError(f"{out} is not a specdec bench folder: it has no {CONFIG}")
    print(_digest(report_folder(out)) + f"\nreport: {out / REPORT}", file=sys.stderr)
    return 0


def report_folder(out: Path) -> dict:
    """summary.json (written atomically) and report.md from the folder's rows; returns the summary."""
    rows = read_rows(out)
    if not rows:
        raise SpecdecError(f"{out / RESULTS} has no finished rows yet: nothing to summarise")
    summary = summarize(rows, read_json(out / CONFIG))
    write_json_atomic(out / SUMMARY, summary)
    write_report(summary, out)
    return summary


def _needs_draft(methods: list[Method], auto: Method | None) -> bool:
    return any(m.needs_draft for m in methods) or (auto is not None and auto.needs_draft)


def bench_config(
    args: argparse.Namespace, methods: list[Method], prompts: list[Prompt], dataset_file: Path, memory_kind: str,
    auto: Method | None = None,
) -> dict:
    """Everything that makes two runs' rows comparable; --resume refuses a folder whose config differs."""
    return {
        "target": args.target,
        "draft": args.draft if _needs_draft(methods, auto) else None,
        "draft_int8": args.draft_int8,
        "draft_vocab": args.draft_vocab,
        "pay_rule": {"file": args.pay_rule, "sha256": file_sha256(Path(args.pay_rule))}
        if args.pay_rule and any(m.pay for m in methods) else None,
        "dtype": resolve_dtype(args.dtype, args.device),
        "device": args.device,
        "methods": [asdict(m) for m in methods],
        "dataset": {"name": args.dataset, "sha256": file_sha256(dataset_file)},
        "selection": {"categories": _split(args.categories), "per_category": args.per_category, "limit": args.limit},
        "prompt_ids": [p.id for p in prompts],
        "raw": args.raw,
        "max_new_tokens": args.max_new_tokens,
        "sampling": {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed},
        "repeats": args.repeats,
        "warmup_tokens": min(WARMUP_TOKENS, args.max_new_tokens),
        "memory": {"kind": memory_kind, "meaning": KINDS[memory_kind]},
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "device_name": device_name(args.device),
        },
    }


def _split(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None



def _resume_command() -> str:
    argv = sys.argv[1:]
    return shlex.join(["specdec", *argv, *([] if "--resume" in argv else ["--resume"])])


def _digest(summary: dict) -> str:
    """A few lines for the terminal; the full picture is in report.md."""
    lines = [f"[specdec bench] {summary['overall']['n_prompts']} prompts"]
    for label, m in summary["overall"]["methods"].items():
        tps = m["tokens_per_s"]["median"] if m["tokens_per_s"] else float("nan")
        s = m["speedup"]
        speed = f", speedup {s['median']:.2f} [{s['ci95_median'][0]:.2f}, {s['ci95_median'][1]:.2f}]" if s else ""
        mal = m["mean_accepted_length"]
        lines.append(f"  {label:<24} {tps:7.2f} tok/s{speed}" + (f", mean accepted length {mal:.2f}" if mal else ""))
    return "\n".join(lines)
