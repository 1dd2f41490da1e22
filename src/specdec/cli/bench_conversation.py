"""`specdec bench --conversations`: multi-turn conversations against OpenAI-compatible servers
(--endpoint, --serve), each answer the server's own and resent with the history
(specdec.bench.conversation), into --out: config.json, results.jsonl (a row per conversation and
server) and summary.json (specdec.bench.conversation_summary)."""

from __future__ import annotations

import argparse
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

from ..errors import SpecdecError
from .bench_endpoints import keep_server_logs, parse_baselines, served_endpoints
from .options import at_least_one


def cmd_conversations(args: argparse.Namespace) -> int:
    """The conversation bench; servers started by --serve stop when it ends, their logs in --out."""
    _refuse_single_prompt_options(args)
    args.serve_api = "chat"  # a conversation is a list of chat messages
    servers = served_endpoints(args)
    out = Path(args.out)
    if servers and not args.resume and out.is_dir() and any(out.iterdir()):  # before minutes of model loading
        raise SpecdecError(f"--out {out} is not empty: pass --resume to continue the run there, or choose a new folder")
    accepted = []
    try:
        with ExitStack() as stack:
            return _run(args, out, lambda: [stack.enter_context(s) for s in servers.values()], accepted)
    finally:
        if accepted:
            keep_server_logs(servers, out)


def _refuse_single_prompt_options(args: argparse.Namespace) -> None:
    """What a conversation bench cannot honour, each a one-line error before anything starts."""
    at_least_one(args, "max_new_tokens", "concurrency")
    refused = {"--methods (specdec's in-process methods: converse with `specdec serve` through --serve)": args.methods,
               "--repeats (a server's cache would hold the first run of a conversation)": args.repeats != 1,
               "--temperature (conversations are greedy: each answer the server's most likely)": args.temperature,
               "--arrival-gap": args.arrival_gap, "--raw": args.raw, "--pay-rule": args.pay_rule}
    for flag, given in refused.items():
        if given:
            raise SpecdecError(f"--conversations takes no {flag}: leave it out")
    if not args.endpoint and not args.serve:
        raise SpecdecError("--conversations measures servers: give --endpoint NAME=URL or --serve NAME=OPTIONS")


def _run(args: argparse.Namespace, out: Path, start_servers, accepted: list) -> int:
    import httpx

    from ..bench.conversation import Server, run_conversations
    from ..bench.conversation_summary import digest, summarize_conversations
    from ..bench.store import RESULTS, SUMMARY, check_out_dir, read_rows
    from ..external.endpoints.spec import CHAT, parse_endpoints, probe
    from ..external.endpoints.stream import openai_client
    from ..files import write_json_atomic
    from ..machine import environment
    from ..prompts.conversations import load_conversations
    from ..prompts.datasets import Selection

    endpoints = parse_endpoints(args.endpoint)
    for e in endpoints:
        if e.api != CHAT:
            raise SpecdecError(f"endpoint {e.name}: a conversation is sent to /v1/chat/completions; give its URL "
                               f"as http://HOST:PORT/v1/chat/completions")
    names = [e.name for e in endpoints]
    baselines = parse_baselines(args.baseline, names)
    split = lambda text: tuple(p.strip() for p in text.split(",") if p.strip()) if text else None
    conversations, sha = load_conversations(args.dataset, Selection(split(args.categories), args.per_category,
                                                                    args.limit))
    for server in start_servers():
        print(f"[specdec bench] started: {shlex.join(server.command)}", file=sys.stderr)
    with httpx.Client(timeout=httpx.Timeout(args.endpoint_timeout)) as probes:
        served = {e.name: probe(e, probes) for e in endpoints}
    config = {
        "kind": "conversations",
        "dataset": {"name": args.dataset, "sha256": sha},
        "selection": {"categories": split(args.categories), "per_category": args.per_category, "limit": args.limit},
        "conversation_ids": [c.id for c in conversations],
        "turns": sum(len(c.turns) for c in conversations),
        "max_tokens": args.max_new_tokens,
        "sampling": "greedy",
        "concurrency": args.concurrency,
        "client": "openai",
        "methods": names,
        "endpoints": {name: {"api": CHAT, "model": s.model} for name, s in served.items()},
        "baselines": baselines,
        "environment": {**environment("cpu", "none", names), "endpoint_urls": {e.name: e.url for e in endpoints}},
    }
    check_out_dir(out, config, args.resume)
    accepted.append(out)
    servers = [Server(e.name, e, served[e.name].model, openai_client(e, args.endpoint_timeout)) for e in endpoints]
    try:
        run_conversations(out, config, conversations, servers, args.max_new_tokens, args.concurrency,
                          progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\nspecdec: interrupted; the {len(read_rows(out))} finished conversations are kept in {out / RESULTS}; "
              f"continue with --resume", file=sys.stderr)
        return 130
    except SpecdecError as e:
        raise SpecdecError(f"{e} ({len(read_rows(out))} finished conversations kept in {out / RESULTS}; "
                           f"continue with --resume)") from None
    finally:
        for s in servers:
            s.client.close()
    summary = summarize_conversations(read_rows(out), config)
    write_json_atomic(out / SUMMARY, summary)
    print(f"[specdec bench] {len(conversations)} conversations\n{digest(summary)}\nsummary: {out / SUMMARY}",
          file=sys.stderr)
    return 0


def conversation_report(out: Path) -> str:
    """`specdec report DIR` of a conversation bench: summary.json rebuilt from the rows, the digest."""
    from ..bench.conversation_summary import digest, summarize_conversations
    from ..bench.store import CONFIG, SUMMARY, read_rows
    from ..files import read_json, write_json_atomic

    summary = summarize_conversations(read_rows(out), read_json(out / CONFIG))
    write_json_atomic(out / SUMMARY, summary)
    return f"{digest(summary)}\nsummary: {out / SUMMARY}"
