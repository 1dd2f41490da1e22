"""How the arguments every command shares (cli.flags) become method specs and one LoadSpec.

The flags -k, --max-ngram, --tree-width, --min-confidence, --pay-rule, --draft-quant (and its
older spelling --draft-int8) and --draft-vocab are shorthands for options of a method spec
(specdec.methods.spec): they fold into the spec that --proposer (generate, check, serve) or
--methods (bench, sweep) names, and a flag that no method takes, or that contradicts the spec, is
a one-line error. The model flags become a specdec.load.LoadSpec in one place, spec_of: below
the command line nothing reads the Namespace.
"""

from __future__ import annotations

import argparse

from ..errors import SpecdecError
from ..load.spec import PLAIN, LoadSpec
from ..methods.spec import Flags, Method, parse


def draft_flags(args: argparse.Namespace) -> Flags:
    """--draft-quant (or --draft-int8) and --draft-vocab as method options (every command has them)."""
    if args.draft_int8 and args.draft_quant not in (None, "int8"):
        raise SpecdecError(f"--draft-int8 contradicts --draft-quant {args.draft_quant}")
    quant = ("--draft-int8", "int8") if args.draft_int8 else ("--draft-quant", args.draft_quant)
    return {"quant": quant, "vocab": ("--draft-vocab", args.draft_vocab)}


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
    flags = method_flags(args)
    return parse(args.proposer, flags)


def spec_of(args: argparse.Namespace, method: Method = PLAIN, pay_rule: str | None = None) -> LoadSpec:
    """What the model flags (add_model_args) say to load, with `method` (method_of's, or the
    `auto` of bench's --methods) and `pay_rule` (--pay-rule, where a command has it)."""
    return LoadSpec(target=args.target, draft=args.draft, method=method, dtype=args.dtype, device=args.device,
                    runtime=args.runtime, target_quant=args.target_quant, quant_group=args.quant_group,
                    trust_remote_code=args.trust_remote_code, pay_rule=pay_rule)
