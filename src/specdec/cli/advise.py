"""`specdec advise`: measure the cost model's terms here and recommend a method (specdec.tune)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..errors import SpecdecError
from ..tune.advice import Advice
from ..tune.advise import AdviseSettings
from ..tune.export import ENGINES
from ..load.choose import Choices, choose
from ..load.loaded import to_stderr
from ..load.models import load_drafts, load_target
from .args import draft_flags, spec_of
from .flags import add_model_args
from .options import add_settings, at_least_one, options, settings_of


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("advise", help="measure the cost terms here, rank every method and confirm the best",
                       description="Times C_T(1), C_V(k) and C_D of each draft form, measures acceptance by "
                       "position of every method family (the draft as none/int8/int4 and with a restricted head, "
                       "prompt lookup, the hybrid) on calibration prompts, predicts the speedup of each family and "
                       "k, calibrates the round options of the best draft and hybrid at their best k (tree width 2 "
                       "and 3, conf, dyn, pay) and prices each from its measured rounds, runs the top 3 paired with "
                       "plain decoding, and times llama.cpp's plain decoding of the same GGUF where installed. "
                       "docs/advise.md says how long it takes; --quick skips the restricted head, the round "
                       "options and the confirmation.")
    add_model_args(a, "draft model; 'none' measures prompt lookup only")
    add_settings(a, AdviseSettings)
    a.add_argument("--dataset", default="spec-bench", help="calibration prompts: a bench dataset name or JSONL")
    a.add_argument("--categories", default="coding,writing,math_reasoning,summarization",
                   help="categories to take one prompt each from ('' = the first prompts of the file)")
    a.add_argument("--raw", action="store_true", help="no chat template")
    a.add_argument("--json", action="store_true", help="print the advice record as one JSON object")
    a.add_argument("--quick", action="store_true",
                   help="fewer candidates (the draft as given and as int4, no restricted head, no round options) "
                        "and no paired confirmation: the choice by prediction only")
    a.add_argument("--random-weights", action="store_true",
                   help="time models of the target's and draft's shapes with random weights (no weights "
                        "needed here); acceptance then comes from --acceptance")
    a.add_argument("--acceptance", metavar="FILE",
                   help="take each proposer's acceptance from this `advise --json` output of a run where "
                        "the real weights are, and measure only the costs here")
    a.add_argument("--export", choices=ENGINES,
                   help="print the recommendation as vLLM's --speculative-config, llama.cpp's llama-server flags "
                        "or a `specdec serve` command line (with --json: as JSON), with the measured reason")
    a.add_argument("--from", dest="from_file", metavar="FILE",
                   help="with --export: take the recommendation from this advice record (`advise --json` output "
                        "or a saved one) instead of measuring; --target and --draft name the models it was for")
    a.set_defaults(func=cmd_advise)


def cmd_advise(args: argparse.Namespace) -> int:
    import torch

    from ..machine import environment
    from ..models.load import resolve_dtype, scored_width
    from ..prompts.chat import encode_prompt
    from ..prompts.datasets import Selection, load_prompts
    from ..runtime.choose import use_native
    from ..tune.advise import run_advise
    from ..tune.candidates import candidates
    from ..tune.render import render
    from ..tune.saved import save_advice

    if args.from_file and not args.export:
        raise SpecdecError("--from FILE gives the advice for --export: add --export vllm, llamacpp or specdec")
    if args.from_file:
        return _print_export(Advice.load(args.from_file), args)
    at_least_one(args, *options(AdviseSettings))
    if args.random_weights and not args.acceptance:
        raise SpecdecError("random weights cannot measure acceptance: add --acceptance FILE, the output of "
                           "`specdec advise --json` run where the real weights are")
    flags = {option: value for option, (_, value) in draft_flags(args).items()}
    if args.draft == "none" and (flags["quant"] or flags["vocab"]):
        raise SpecdecError("--draft-quant and --draft-vocab apply to a draft: not with --draft none")
    if args.random_weights and flags["vocab"]:
        raise SpecdecError("--draft-vocab counts token frequencies with the tokenizer: not with --random-weights")
    saved = Advice.load(args.acceptance) if args.acceptance else None
    categories = tuple(c for c in args.categories.split(",") if c) or None
    prompts, _ = load_prompts(args.dataset, Selection(categories, 1 if categories else None, args.prompts))
    has_draft = args.draft != "none"
    spec = spec_of(args)
    # on the runtime generate would run (--runtime): its costs are the ones the advice is for;
    # random weights run on transformers' models (_load_random)
    choices = choose(replace(spec, runtime="hf") if args.random_weights else spec)
    if args.random_weights:
        families = candidates(has_draft, args.device, flags["quant"], flags["vocab"], quick=args.quick)
        target, drafts, tokenizer = _load_random(choices)
    else:
        target, tokenizer = load_target(choices, to_stderr)
        native = has_draft and use_native(spec.runtime, spec.draft, "int4", spec.device)
        families = candidates(has_draft, args.device, flags["quant"], flags["vocab"], scored_width(target), args.quick,
                              native)
        drafts = load_drafts(spec, target, tokenizer, families)
    if tokenizer is None:  # only plain decoding's bookkeeping is timed on these: any ids do
        gen = torch.Generator().manual_seed(0)
        encoded = [torch.randint(scored_width(target), (32,), generator=gen).tolist() for _ in prompts]
    else:
        encoded = [encode_prompt(tokenizer, p.text, raw=args.raw) for p in prompts]
    quick = {"confirm": 0, "round_options": False} if args.quick else {}
    settings = replace(settings_of(args, AdviseSettings), prompts=len(prompts), **quick)
    say = lambda step: print(f"[advise] {step}", file=sys.stderr, flush=True)
    advice = run_advise(target, drafts, families, tokenizer, settings, encoded, progress=say, saved=saved)
    advice = replace(
        advice, random_weights=args.random_weights,
        llamacpp=_versus_llamacpp(args, advice, encoded, settings.tokens, say),
        calibration_prompts=[p.id for p in prompts] if saved is None else f"from {args.acceptance}",
        environment=environment(args.device, resolve_dtype(args.dtype, args.device), [f.label for f in families],
                                choices.record()),
    )
    if not args.export:
        print(json.dumps(advice.to_json(), indent=1) if args.json else render(advice))
    path = save_advice(choices.setup(flags["vocab"]), advice)
    print(f"[advise] saved for `specdec generate --proposer auto`: {path}", file=sys.stderr)
    return _print_export(advice, args) if args.export else 0


def _print_export(advice, args: argparse.Namespace) -> int:
    from ..tune.export import export

    target, draft = (_engine_file(name, args.export) for name in (args.target, args.draft))
    out = export(advice, args.export, target, draft)
    print(json.dumps(out.to_json(), indent=1) if args.json else out.render())
    return 0


def _engine_file(name: str, engine: str) -> str:
    """What the engine loads for a registry name or a folder: llama.cpp a GGUF file, vLLM a
    Hugging Face folder (a registry model's converted safetensors folder in the cache), specdec
    what it was given."""
    from ..registry import REGISTRY, converted_folder, gguf_file

    if engine == "specdec":
        return name
    if name in REGISTRY:
        return str(gguf_file(name) if engine == "llamacpp" else converted_folder(REGISTRY[name]))
    return f"{name}.gguf" if engine == "llamacpp" else name  # a folder: llama.cpp needs its GGUF conversion


def _versus_llamacpp(args: argparse.Namespace, advice: Advice, prompts: list[list[int]], tokens: int, say) -> dict:
    """llama.cpp's plain decoding of the target's GGUF against specdec's plain decoding and
    choice, or why it was not timed (random weights time shapes, not the GGUF's model)."""
    from ..tune.versus import against_llamacpp, llamacpp_available, time_llamacpp

    why_not = "random weights" if args.random_weights else llamacpp_available(args.target)
    if why_not:
        return {"not_timed": why_not}
    return against_llamacpp(time_llamacpp(args.target, prompts, tokens, say), advice.plain_tokens_per_s, advice.choice)


def _load_random(choices: Choices):
    """Random-weight models of the target's and the draft's shapes, and no tokenizer."""
    from ..methods.build import Drafts
    from ..models.load import random_model
    from ..models.quant_cache import quantize_model
    from ..models.quant_options import check_options

    spec, quant = choices.spec, choices.form.quant
    # Rounded, not from the GGUF: a random model's costs do not depend on the weights' values.
    to_stderr(choices.form.line(spec.target))
    check_options(quant, spec.quant_group, spec.device)
    target = quantize_model(random_model(spec.target, spec.dtype, spec.device), None, quant, spec.quant_group)
    draft = None if spec.draft == "none" else random_model(spec.draft, spec.dtype, spec.device)
    return target, Drafts(draft, group=spec.quant_group), None
