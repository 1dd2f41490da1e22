"""Command-line options from settings dataclasses, and the checks every command's numbers share."""

from __future__ import annotations

import argparse
import dataclasses

from ..errors import SpecdecError


def ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecdecError(f"--{name} takes a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecdecError(f"--{name} needs positive integers, got {text!r}")
    return values


def options(settings: type) -> list[str]:
    """The fields of a settings dataclass that are command-line options: those with a help text."""
    return [f.name for f in dataclasses.fields(settings) if "help" in f.metadata]


def add_settings(p: argparse.ArgumentParser, settings: type) -> None:
    """The options of a settings dataclass (--name, or the field's "flag"), with its defaults."""
    for f in dataclasses.fields(settings):
        if f.name in options(settings):
            flag = f.metadata.get("flag") or f"--{f.name.replace('_', '-')}"
            p.add_argument(flag, dest=f.name, type=type(f.default), default=f.default, help=f.metadata["help"])


def settings_of(args: argparse.Namespace, settings: type, **rest):
    """The settings dataclass from its options' values (and `rest`)."""
    return settings(**{name: getattr(args, name) for name in options(settings)}, **rest)


def at_least_one(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def check_sampling(args: argparse.Namespace) -> None:
    """--temperature, --top-k and --top-p checked as generation will check them, but before any
    model loads, so a bad value is the only line printed."""
    from ..decode.sampling import SamplingConfig

    SamplingConfig(args.temperature, args.top_k, args.top_p, args.min_p)  # validates them


def positive_settings(args: argparse.Namespace, settings: type) -> None:
    """Every integer option of a settings dataclass must be >= 1, named by its flag."""
    for f in dataclasses.fields(settings):
        if f.name in options(settings) and isinstance(f.default, int):
            value = getattr(args, f.name)
            if value < 1:
                flag = f.metadata.get("flag") or f"--{f.name.replace('_', '-')}"
                raise SpecdecError(f"{flag} must be >= 1, got {value}")
