"""Command line: specdec generate | serve | check | bench | report | advise | sweep | perplexity.

One module per command (each registers its parser; models and torch load only when a command
runs); the arguments they share, and how those become method specs and loaded models, are in
args.py.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import SpecdecError
from . import advise, bench, check, generate, perplexity, serve, sweep

COMMANDS = (generate, serve, check, bench, advise, sweep, perplexity)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .args import resolve_target_form

    args = build_parser().parse_args(argv)
    try:
        resolve_target_form(args)
        return args.func(args)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
