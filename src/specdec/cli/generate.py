"""`specdec generate`: speculative generation with live acceptance."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecdecError
from ..load.loaded import load
from .args import method_of, spec_of
from .flags import add_method_args, add_model_args, add_penalty_args, add_sampling_args, penalties_of
from .options import at_least_one, check_sampling

if TYPE_CHECKING:  # torch loads when a command runs
    from ..decode.engine import GenerationResult


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate text, speculatively, with live acceptance")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    add_model_args(g)
    add_method_args(g, default="auto")
    add_sampling_args(g)
    add_penalty_args(g)
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="the output is JSON valid under this JSON schema file")
    shape.add_argument("--grammar", metavar="FILE",
                       help="the output matches this grammar file (llama.cpp's GBNF, or llguidance's Lark)")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="green: tokens the proposer guessed; plain: tokens from the target")
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..decode.engine import GenerationInterrupted, generate
    from ..prompts.chat import encode_prompt, require_text
    from .stream import Streamer

    text = require_text(_prompt_text(args))
    at_least_one(args, "max_new_tokens")
    check_sampling(args)  # every option before a model loads: a bad value is the only line printed
    penalties = penalties_of(args)
    grammar = _grammar(args)
    spec = spec_of(args, method_of(args), args.pay_rule)
    loaded = load(spec)
    tokenizer = loaded.tokenizer
    prompt = encode_prompt(tokenizer, text, raw=args.raw)
    streamer = None if args.json else Streamer(tokenizer, color=_use_color(args.color))
    code = 0
    lm = loaded.lm()
    try:
        result = generate(
            lm, prompt, drafter=loaded.proposer,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed, on_commit=streamer.on_commit if streamer else None,
            rules=penalties.rules(len(prompt), lm.vocab_size) + _grammar_rules(grammar, tokenizer, lm, len(prompt)),
        )
    except GenerationInterrupted as interrupt:  # Ctrl-C: still show what was committed
        result, code = interrupt.result, 130
    ran = {"method": loaded.method.label, "why": loaded.choices.why, "target": loaded.choices.record()}
    if args.json:
        print(json.dumps(_json_result(tokenizer, result) | {"ran": ran}))
    else:
        streamer.finish()
        print(summary_line(result), file=sys.stderr)
    return code


def _grammar(args: argparse.Namespace):
    """--json-schema FILE or --grammar FILE as a constrain.Grammar (None: neither), read and
    checked before any model loads."""
    from ..constrain import gbnf, json_schema

    path = args.json_schema or args.grammar
    if path is None:
        return None
    flag = "--json-schema" if args.json_schema else "--grammar"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecdecError(f"{flag}: cannot read {path} ({e})") from None
    if args.grammar:
        return gbnf(text, f"--grammar {path}")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecdecError(f"--json-schema {path} is not JSON ({e}): give a JSON schema file") from None
    return json_schema(schema, f"--json-schema {path}")


def _grammar_rules(grammar, tokenizer, lm, prompt_length: int) -> tuple:
    from ..constrain import grammar_rule

    if grammar is None:
        return ()
    return (grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, prompt_length),)


def _json_result(tokenizer, result) -> dict:
    return {
        "text": tokenizer.decode(result.new_tokens, skip_special_tokens=True),
        "new_tokens": result.new_tokens,
        "finish_reason": result.finish_reason,
        "stats": result.stats.to_dict(),
    }


def summary_line(result: GenerationResult) -> str:
    """The generation on one line, every figure the engine's record's (decode.stats)."""
    s = result.stats
    t = s.times
    spec = (f"; {s.rounds} rounds, mean accepted length {s.mean_accepted_length:.2f} "
            f"(acceptance {100 * s.acceptance_rate:.0f}% of {s.proposed} proposed), "
            f"draft calls {s.draft_calls}") if s.proposed else ""
    return (f"[specdec] {s.new_tokens} tokens ({result.finish_reason}), decode {s.tokens_per_s:.2f} tok/s, "
            f"target calls {s.target_calls}{spec}; prefill {s.prefill_seconds:.2f}s, propose "
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
