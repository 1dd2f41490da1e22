"""How the arguments every command shares (cli.flags) become method specs and loaded models.

The flags -k, --max-ngram, --tree-width, --min-confidence, --pay-rule, --draft-quant (and its
older spelling --draft-int8) and --draft-vocab are shorthands for options of a method spec (specdec.methods.spec): they fold into the
spec that --proposer (generate, check) or --methods (bench, sweep) names, and a flag that no
method takes, or that contradicts the spec, is a one-line error. --target-quant and --quant-group say how the target is loaded
(specdec.models.quant_cache) and are recorded in every config (machine.environment's "quant").
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import SpecdecError
from ..methods.spec import Flags, Method, parse, resolve_auto

if TYPE_CHECKING:  # for annotations only: a command imports the advice (and scipy) when it needs it
    from ..tune.advice import Advice


def draft_flags(args: argparse.Namespace) -> Flags:
    """--draft-quant (or --draft-int8) and --draft-vocab as method options (every command has them)."""
    if args.draft_int8 and args.draft_quant not in (None, "int8"):
        raise SpecdecError(f"--draft-int8 contradicts --draft-quant {args.draft_quant}")
    quant = ("--draft-int8", "int8") if args.draft_int8 else ("--draft-quant", args.draft_quant)
    return {"quant": quant, "vocab": ("--draft-vocab", args.draft_vocab)}


def resolve_target_form(args: argparse.Namespace) -> None:
    """--target-quant auto replaced by the form it picks (specdec.models.target_form), kept with
    its reason in args.target_form; every command with a target runs this before anything reads
    --target-quant. The form is said on stderr where the target loads (say_target_form), after
    the arguments' one-line errors."""
    from ..models.target_form import choose_form

    if not hasattr(args, "target_quant") or hasattr(args, "target_form"):
        return
    args.target_form = choose_form(args.target_quant, args.target, args.device)
    args.target_quant = args.target_form.quant


def say_target_form(args: argparse.Namespace) -> None:
    """The target's form and why, on stderr (every command that loads the target)."""
    resolve_target_form(args)
    print(args.target_form.line(args.target), file=sys.stderr)


def target_runtime(args: argparse.Namespace, runtime: str | None = None) -> str:
    """"native" or "hf": where the target of these arguments runs (--runtime, or `runtime` where
    the command decides it: advise on random weights times transformers' models)."""
    from ..runtime.choose import use_native

    resolve_target_form(args)  # main() has, unless the arguments were parsed elsewhere
    return "native" if use_native(runtime or args.runtime, args.target, args.target_quant, args.device) else "hf"


def quant_record(args: argparse.Namespace, runtime: str | None = None) -> dict:
    """How the target's weights are quantized and why, and the runtime it runs on, for configs
    and advice (machine.environment); `runtime` as in target_runtime."""
    from ..models.quant_options import describe

    where = target_runtime(args, runtime)  # resolves --target-quant auto first
    return {"target": describe(args.target_quant, args.quant_group), "group": args.quant_group,
            "target_reason": args.target_form.reason, "runtime": where}


def load_target(args: argparse.Namespace, runtime: str | None = None):
    """The target of --target, quantized as --target-quant says, on the runtime --runtime (or
    `runtime`) picks: a transformers model or a native runtime (runtime.NativeLM); and its tokenizer."""
    say_target_form(args)
    if target_runtime(args, runtime) == "native":
        from ..gguf import tokenizer_of
        from ..runtime import load_gguf

        return load_gguf(args.target, args.target_quant), tokenizer_of(args.target)
    from ..models.load import load_model

    return load_model(args.target, args.dtype, args.device, args.trust_remote_code, args.target_quant,
                      args.quant_group)


def method_flags(args: argparse.Namespace) -> Flags:
    """Every flag of add_model_args and add_method_args as method options."""
    return {
        **draft_flags(args),
        "k": ("-k", args.k),
        "ngram": ("--max-ngram", args.max_ngram),
        "width": ("--tree-width", args.tree_width),
        "conf": ("--min-confidence", args.min_confidence or None),  # 0: off, as not given
        "pay": ("--pay-rule", "1" if args.pay_rule else None),
    }


def method_of(args: argparse.Namespace) -> Method:
    """The method --proposer and its flags name."""
    return parse(args.proposer, method_flags(args))


def setup_of(args: argparse.Namespace, vocab: int | None, runtime: str | None = None):
    """What saved advice is keyed by, for these arguments (specdec.tune.saved.Setup): the target
    with its form and, on specdec's native runtime, that runtime (its costs are not the hf ones);
    `runtime` as in target_runtime."""
    from ..tune.saved import Setup

    record = quant_record(args, runtime)
    quant = record["target"]
    target = args.target if quant == "none" else f"{args.target} ({quant})"
    target += ", native runtime" if record["runtime"] == "native" else ""
    return Setup.create(target, args.draft, args.dtype, args.device, vocab)


def resolve(args: argparse.Namespace, method: Method) -> tuple[Method, str | None]:
    """`auto` replaced by what the saved advice (or the device default) chose, with auto's own
    options where that method takes them; and a line saying so (None for other methods)."""
    from ..tune.saved import choose

    if method.kind != "auto":
        return method, None
    chosen, why = choose(setup_of(args, method.vocab), lambda: draft_vocabulary(args),
                         lambda quant: draft_runs(args, quant))
    resolved, dropped = resolve_auto(method, chosen)
    shown = "plain decoding" if resolved.kind == "ar" else resolved.label
    unused = f"; {', '.join(dropped)} not applied" if dropped and resolved.kind != "ar" else ""
    return resolved, f"{shown} ({why}){unused}"


def draft_runs(args: argparse.Namespace, quant: str | None) -> bool:
    """Whether --draft runs in the weight form `quant` where --runtime puts it (int3: only on
    specdec's native runtime)."""
    from ..errors import SpecdecError
    from ..quant import NATIVE_ONLY
    from ..runtime.choose import use_native

    if quant not in NATIVE_ONLY:
        return True
    try:
        return use_native(args.runtime, args.draft, quant, args.device)
    except SpecdecError:  # --runtime native and a draft it cannot run: the draft's loader says so later
        return False


def draft_vocabulary(args: argparse.Namespace) -> int | None:
    """The vocabulary size of --draft (a GGUF's metadata, a local folder's config), read without
    loading weights; None where there is no draft or no readable config (a hub id is not fetched
    for this)."""
    from pathlib import Path

    from ..gguf import gguf_path, is_gguf, prepared

    if is_gguf(args.draft):
        return prepared(gguf_path(args.draft))[1].config.vocab
    if not Path(args.draft).is_dir():
        return None
    from transformers import AutoConfig

    where = args.draft
    try:
        return AutoConfig.from_pretrained(where, trust_remote_code=args.trust_remote_code).vocab_size
    except (OSError, ValueError):
        return None


def pay_advice(args: argparse.Namespace, asked: Method | None, runs: Method | None) -> Advice | None:
    """The advice whose cost terms pay=1 stops by: --pay-rule FILE, else, where `auto` (`asked`)
    chose a method with pay=1 (`runs`), the saved advice that chose it; None otherwise."""
    from ..tune.advice import Advice
    from ..tune.saved import advice_path

    if args.pay_rule:
        return Advice.load(args.pay_rule)
    if asked is not None and asked.kind == "auto" and runs is not None and runs.pay:
        return Advice.load(advice_path(setup_of(args, asked.vocab)))
    return None


def load_drafts(args: argparse.Namespace, target, tokenizer, methods: list[Method], reuse_caches: bool = False,
                runtime: str | None = None):
    """The draft of --draft, checked against the target's vocabulary, with the variants the
    methods run built (specdec.methods.build.Drafts): on the native runtime where --runtime (or
    `runtime`) puts them, else from one transformers model, which is loaded only if a variant
    needs it; nothing is loaded when no method runs a draft."""
    from ..methods.build import Drafts
    from ..models.load import check_same_vocab, load_model, load_tokenizer
    from ..runtime.choose import use_native

    drafting = [m for m in methods if m.uses_draft]
    if not drafting:
        return Drafts(None)
    if args.draft == "none":
        raise SpecdecError(f"{drafting[0].label} needs a draft model: drop it or pass --draft")
    native = {m.draft_variant for m in drafting
              if not m.is_hf and use_native(runtime or args.runtime, args.draft, draft_quant(args, m), args.device)}
    draft = draft_tokenizer = None
    if any(m.draft_variant not in native for m in drafting):
        draft, draft_tokenizer = load_model(args.draft, args.dtype, args.device, args.trust_remote_code)
    if not check_gguf_pair(args):  # a GGUF pair is judged by its metadata; else by the tokenizers, and
        # before the variants are made: a restricted head scores fewer ids by design
        check_same_vocab(tokenizer, draft_tokenizer or load_tokenizer(args.draft, args.trust_remote_code), target,
                         draft)
    drafts = Drafts(draft, tokenizer, reuse_caches, source=args.draft, group=args.quant_group, native=native)
    drafts.prepare(methods)
    return drafts


def check_gguf_pair(args: argparse.Namespace) -> bool:
    """Where --target and --draft are both GGUF files (or registry names), refuse a draft of
    another tokenizer from their metadata (specdec.gguf.check_pair; cheap, so load_proposer asks
    before any weight loads); whether they were both GGUF."""
    from ..gguf import check_pair, gguf_path, is_gguf, prepared

    if args.draft == "none" or not (is_gguf(args.target) and is_gguf(args.draft)):
        return False
    check_pair(prepared(gguf_path(args.target))[1], prepared(gguf_path(args.draft))[1])
    return True


def store_draft(args: argparse.Namespace, method: Method) -> None:
    """A native GGUF draft's weights read into the model cache before the target loads (a no-op
    once there): its first conversion then peaks alone, not beside a loaded target."""
    from ..runtime.choose import use_native

    quant = draft_quant(args, method)
    if not method.is_hf and use_native(args.runtime, args.draft, quant, args.device):
        from ..runtime.native.loader import store_gguf

        store_gguf(args.draft, quant)


def draft_quant(args: argparse.Namespace, method: Method) -> str:
    """The form a method's draft runs in: its quant=, or, without one, dense for a registry name or
    a folder and the file as it is (int4: its own blocks) for a GGUF file, which has no dense copy."""
    from ..gguf import is_gguf
    from ..registry import REGISTRY

    if method.quant:
        return method.quant
    return "int4" if args.draft not in REGISTRY and is_gguf(args.draft) else "none"


def load_proposer(args: argparse.Namespace, method: Method):
    """Target, tokenizer, `method` (what --proposer names: method_of) with auto resolved, and its
    proposer (None: plain decoding). generate and check run this."""
    from ..methods.build import build_proposer, check_specdec
    from ..models.load import check_name

    check_name(args.target)  # a bad --target said before auto reads (or assembles) the draft's GGUF
    asked = method
    method, said = resolve(args, method)
    check_specdec(method)  # before the models load (slow)
    advice = pay_advice(args, asked, method)
    if method.uses_draft and check_gguf_pair(args):
        store_draft(args, method)
    target, tokenizer = load_target(args)
    args.method_reason = f"auto: {said}" if said else "as --proposer says"  # generate's --json reports it
    if said:  # said once the target is known to load, so a bad name still gives a one-line error
        print(f"[specdec] auto: {said}", file=sys.stderr)
    drafts = load_drafts(args, target, tokenizer, [method])
    return target, tokenizer, method, build_proposer(method, drafts, advice.rule_for(method) if advice else None)
