"""Command line: specdec generate | chat | serve | check | bench | report | advise | sweep | perplexity.

One module per command (each registers its parser; models and torch load only when a command
runs); the arguments they share, and how those become method specs and one LoadSpec
(specdec.load), are in args.py.
"""

from __future__ import annotations

import argparse
import sys

from importlib import import_module

from ..errors import SpecdecError

# command -> (module that registers it, one line of help): `specdec --help` lists them without
# importing any, and a command imports only its own module (torch and transformers load when a
# command needs a model, not to parse arguments).
COMMANDS = {
    "generate": ("generate", "generate text, speculatively, with live acceptance"),
    "serve": ("serve", "an OpenAI-compatible HTTP server that decodes speculatively"),
    "chat": ("chat", "a conversation in the terminal, speculatively, the cache kept between turns"),
    "check": ("check", "prove losslessness of speculation on a model pair"),
    "bench": ("bench", "paired, resumable benchmark of decoding methods (and servers)"),
    "report": ("bench", "rebuild summary.json and report.md of a bench folder from its rows"),
    "advise": ("advise", "measure the cost terms here, rank every method and confirm the best"),
    "sweep": ("sweep", "cost terms and speedup against context length"),
    "perplexity": ("perplexity", "perplexity of llama.cpp and of the bf16/int8/int4 target on the same text"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's arguments, or (`command` given) with that command's
    alone, the others listed by name and help."""
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    full = {module for name, (module, _) in COMMANDS.items() if command is None or name == command}
    for name, (module, line) in COMMANDS.items():
        if module not in full:
            sub.add_parser(name, help=line)
        elif name == next(n for n, (m, _) in COMMANDS.items() if m == module):  # its first command registers all
            import_module(f".{module}", __name__).register(sub)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The command argv names, None where it names none (`specdec --help`)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _command_of(argv)
    args = build_parser(command if command in COMMANDS else "").parse_args(argv)
    try:
        return args.func(args)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
