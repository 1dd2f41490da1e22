"""What a bench's endpoints are: the --serve servers it starts, the --endpoint servers with each
one's --baseline (checked before anything loads), and on --resume which of them have finished."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ..errors import SpecdecError
from ..methods.spec import Method


def served_endpoints(args: argparse.Namespace) -> dict:
    """The --serve servers by name (not started), each added to args.endpoint at its URL."""
    from ..external.specdec_server import SpecdecServer

    servers = {}
    for text in args.serve:
        name, sep, options = text.partition("=")
        if not sep or not name:
            raise SpecdecError(f"--serve takes NAME=OPTIONS (specdec serve's, e.g. spec='--proposer auto'); "
                               f"got {text!r}")
        if name in servers:
            raise SpecdecError(f"two --serve endpoints are called {name}: give each its own name")
        try:
            options = shlex.split(options)
        except ValueError as e:
            raise SpecdecError(f"--serve {name}: its options do not parse ({e})") from None
        base = ["--target", args.target, "--draft", args.draft, *(["--trust-remote-code"] if args.trust_remote_code
                                                                   else [])]
        servers[name] = SpecdecServer([*base, *options])
        path = "/v1/chat/completions" if args.serve_api == "chat" else "/v1/completions"
        args.endpoint = [*args.endpoint, f"{name}={servers[name].url}{path}"]
    return servers


def keep_server_logs(servers: dict, out: Path) -> None:
    """Each started server's log into --out as server-NAME.log (where --out exists)."""
    import shutil

    for name, server in servers.items():
        if server.server.process is not None and server.log.is_file():
            shutil.copyfile(server.log, out / f"server-{name}.log")


def finished_methods(out: Path, prompts, repeats: int) -> dict[str, dict]:
    """The methods of a run in `out` with a row for every prompt and repeat: their labels, each
    with the endpoint entry the run's config stored for it (None for specdec's own methods). On
    --resume these need not run again: a finished endpoint may be down."""
    from ..bench.store import CONFIG, read_rows
    from ..files import read_json

    if not (out / CONFIG).is_file():
        return {}
    wanted = {(p.id, r) for p in prompts for r in range(repeats)}
    have: dict[str, set] = {}
    for row in read_rows(out):
        have.setdefault(row["method"], set()).add((row["prompt_id"], row["repeat"]))
    stored = read_json(out / CONFIG).get("endpoints") or {}
    return {label: stored.get(label.removeprefix("endpoint:name=")) for label, done in have.items() if wanted <= done}


def bench_endpoints(args: argparse.Namespace, local: list[Method], sampling) -> tuple[list, dict[str, str]]:
    """The --endpoint servers and each one's --baseline endpoint (labels; a baseline is its own),
    with one-line errors for what cannot be measured fairly."""
    from ..external.endpoints.spec import parse_endpoints

    endpoints = parse_endpoints(args.endpoint)
    if not endpoints and not local:
        raise SpecdecError("nothing to measure: give --methods or --endpoint")
    if not endpoints:
        for flag, given in (("--baseline", args.baseline), ("--concurrency", args.concurrency > 1),
                            ("--arrival-gap", args.arrival_gap)):
            if given:
                raise SpecdecError(f"{flag} applies to endpoints: add --endpoint NAME=URL")
        return [], {}
    if args.arrival_gap < 0 or (args.arrival_gap and args.concurrency < 2):
        raise SpecdecError(f"--arrival-gap spaces the requests of a wave: give it >= 0 seconds with --concurrency "
                           f"N > 1 (got {args.arrival_gap} with --concurrency {args.concurrency})")
    if args.concurrency > 1 and local:
        raise SpecdecError("--concurrency runs endpoints only (specdec's methods run one at a time in this "
                           f"process): bench {', '.join(m.label for m in local)} without it, in another --out")
    label = lambda name: f"endpoint:name={name}"
    return endpoints, {label(e): label(b) for e, b in parse_baselines(args.baseline, [e.name for e in endpoints]).items()}


def parse_baselines(texts: list[str], names: list[str]) -> dict[str, str]:
    """--baseline values -> {endpoint name: its baseline's name}: `BASE=A,B` for A and B, a bare
    `BASE` (at most one) for every endpoint no other --baseline names; each baseline is its own."""
    pairs: dict[str, str] = {}
    default = None
    for text in texts:
        base, sep, others = text.partition("=")
        named = [o.strip() for o in others.split(",") if o.strip()] if sep else []
        if sep and not named:
            raise SpecdecError(f"--baseline {text}: name the endpoints compared with {base} after '=' "
                               f"(e.g. {base}=spec), or give {base} alone")
        for name in (base, *named):
            if name not in names:
                raise SpecdecError(f"--baseline {base} is not one of the endpoints ({', '.join(names)})"
                                   if name == base else f"--baseline {text}: {name} is not one of the endpoints "
                                   f"({', '.join(names)})")
        if not sep:
            if default is not None:
                raise SpecdecError(f"--baseline {default} and --baseline {base}: only one baseline may go "
                                   f"without '=OTHER,...' (it is every other endpoint's)")
            default = base
        for name in (base, *named):
            if pairs.get(name, base) != base:
                raise SpecdecError(f"endpoint {name} has two baselines ({pairs[name]} and {base}): give it one")
            pairs[name] = base
    if default is not None:
        pairs.update({name: default for name in names if name not in pairs})
    return pairs
