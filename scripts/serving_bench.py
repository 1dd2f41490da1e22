"""Start servers on this machine, for each engine a plain one and its speculative ones (llama.cpp's
llama-server, the default, vLLM's CPU server and/or specdec's own `specdec serve`: --engine,
repeatable), and run one `specdec
bench --endpoint` over all of them (and optionally `specdec check --endpoint` of each speculative
server against its engine's plain one): the runs behind docs/serving.md. The servers are stopped
when the runs end, whatever happens.

    .venv/bin/python scripts/serving_bench.py --model smollm2-135m-instruct --out runs/serving \\
        -- --dataset humaneval --limit 10 --max-new-tokens 128 --target smollm2-135m-instruct
    .venv/bin/python scripts/serving_bench.py --model qwen2.5-coder-1.5b-instruct \\
        --draft qwen2.5-coder-0.5b-instruct --spec-args "--spec-draft-n-max 2 --spec-draft-p-min 0" --check \\
        --out runs/serving-qwen -- --dataset humaneval --limit 10 --methods ar,draft:k=2:quant=int8
    .venv/bin/python scripts/serving_bench.py --engine llamacpp --engine vllm --model qwen2.5-coder-1.5b-instruct \\
        --draft qwen2.5-coder-0.5b-instruct --spec-args "--spec-draft-n-max 3" \\
        --spec-config '{"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_max": 3, "prompt_lookup_min": 1}' \\
        --out runs/all -- --dataset humaneval --limit 10 --methods ar,auto

    .venv/bin/python scripts/serving_bench.py --engine specdec --model qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --concurrency 4 --api chat --out runs/specdec-c4 \
        -- --dataset humaneval --limit 8 --max-new-tokens 128 --client openai

Servers are named ENGINE-plain (llama-plain, vllm-plain, specdec-plain), llama-spec, specdec-spec
and vllm-METHOD for each --spec-config (vllm-ngram, vllm-draft_model, ...); bench compares each
speculative server with its own engine's plain one (--baseline llama-plain=llama-spec ...).
specdec: `specdec serve --target MODEL --draft DRAFT` with `--proposer ar` (plain) and `--proposer
SPEC` (--spec-proposer, default auto), each with --specdec-args. Everything after `--` goes to
`specdec bench` (add --methods to run specdec's own methods beside the servers). llama.cpp:
--draft defaults to the model itself; --server-args are passed to every server, --spec-args to
llama-spec only. vLLM: each --spec-config is a speculative server's speculative_config (`specdec
advise --export vllm --json` prints one), a registry name as its `model` meaning that model's
converted folder. --check writes check-NAME.json into --out for each speculative server started.

Servers that do not fit in memory together are measured in passes over one bench folder: the
first without some servers, a later one with them added (bench --resume adds methods) and
--only naming the ones to start, e.g. vllm-plain (asked again for the gaps of differences) and
the new vllm-draft_model.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

from specdec.cli import main as specdec
from specdec.errors import SpecdecError
from specdec.external.llama_server import LlamaServer
from specdec.external.specdec_server import SpecdecServer
from specdec.external.vllm_server import VllmServer
from specdec.registry import REGISTRY, converted_folder, gguf_file, known_models

PREFIX = {"llamacpp": "llama", "vllm": "vllm", "specdec": "specdec"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", action="append", choices=tuple(PREFIX),
                   help="llamacpp (default), vllm and/or specdec (specdec serve)")
    p.add_argument("--model", required=True, choices=known_models(), help="registry name of the served model (its "
                   "GGUF for llama.cpp, its converted folder for vLLM)")
    p.add_argument("--draft", help="llama.cpp: registry name of the draft (default: the model itself); none: no draft "
                   "model, the speculative server speculates as --spec-args say (e.g. n-gram lookup)")
    p.add_argument("--spec-args", default="", help="llama.cpp: more llama-server flags for the speculative server, "
                   "e.g. the ones `specdec advise --export llamacpp` prints")
    p.add_argument("--spec-config", action="append", default=[],
                   help="vLLM: a speculative server's speculative_config JSON (repeatable: one server each)")
    p.add_argument("--server-args", default="", help="more server flags for every llama.cpp and vLLM server")
    p.add_argument("--spec-proposer", default="auto", help="specdec: the speculative server's --proposer (default "
                   "auto); the plain one runs --proposer ar")
    p.add_argument("--specdec-args", default="", help="specdec: more `specdec serve` options for both servers "
                   "(e.g. --target-quant int4)")
    p.add_argument("--api", choices=["completions", "chat"], default="completions",
                   help="the API bench sends to: /v1/completions (prompt ids, the default) or /v1/chat/completions "
                   "(the prompt as a user message, each server's own chat template)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=1, help="llama.cpp: server slots (requests served at once), both "
                   "servers; give bench --concurrency the same number (vLLM batches up to 4 by itself); with more "
                   "than one slot the servers' logs are named server-NAME-npN.log")
    p.add_argument("--concurrency", help="comma list N,...: one bench per N on the same servers (bench --concurrency "
                   "N, into --out/bench-cN), llama.cpp's slots the largest N; servers start once for all")
    p.add_argument("--out", required=True)
    p.add_argument("--check", action="store_true", help="also run specdec check --endpoint of each speculative "
                   "server against its engine's plain one")
    p.add_argument("--only", help="comma list of the servers to start: bench still gets every server as an endpoint, "
                   "the others down, for a resumed run (bench --resume) that has their rows and adds the started "
                   "ones'; where the servers do not all fit in memory (vLLM CPU: 8-9 GB per 1.5B server)")
    p.add_argument("--spec-only", action="store_true", help="start and measure the speculative servers alone (no "
                   "baseline, no check)")
    args, bench = p.parse_known_args()
    bench = [a for a in bench if a != "--"]
    levels = [int(n) for n in args.concurrency.split(",")] if args.concurrency else [1]
    args.parallel = max(args.parallel, *levels)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    servers = {}
    starters = {"llamacpp": llama_servers, "vllm": vllm_servers, "specdec": specdec_servers}
    for engine in args.engine or ["llamacpp"]:
        servers.update(starters[engine](args, out))
    if args.spec_only:
        servers = {n: s for n, s in servers.items() if not is_plain(n)}
    chosen = args.only.split(",") if args.only else list(servers)
    unknown = [n for n in chosen if n not in servers]
    if unknown:
        raise SystemExit(f"--only {','.join(unknown)}: not among the servers {', '.join(servers)}")
    with ExitStack() as stack:
        started = {name: stack.enter_context(servers[name]) for name in chosen}
        for name, server in started.items():
            print(f"[serving] {name}: {shlex.join(server.command)}", file=sys.stderr)
        path = "/v1/chat/completions" if args.api == "chat" else "/v1/completions"
        endpoints = [a for name, server in servers.items() for a in ("--endpoint", f"{name}={server.url}{path}")]
        common = ["bench", *endpoints, *baseline_args(plain_of(list(servers)))]
        code = 0
        for n in levels:
            code = code or specdec([*common, "--out", str(out / (f"bench-c{n}" if args.concurrency else "bench")),
                                    *(["--concurrency", str(n)] if args.concurrency else []), *bench])
        pairs = plain_of(list(started))
        target = bench[bench.index("--target") + 1] if "--target" in bench else args.model
        if args.check and code == 0:
            for spec, plain in pairs.items():
                code = max(code, check(started[spec], started[plain], target, out / f"check-{spec}.json"))
    return code


def is_plain(name: str) -> bool:
    return name.endswith("-plain")


def plain_of(names: list[str]) -> dict[str, str]:
    """Each speculative server's engine's plain server, where that one is among `names`."""
    return {n: f"{n.split('-')[0]}-plain" for n in names if not is_plain(n) and f"{n.split('-')[0]}-plain" in names}


def baseline_args(pairs: dict[str, str]) -> list[str]:
    """bench's --baseline PLAIN=SPEC,... for each engine's plain server."""
    return [a for plain in dict.fromkeys(pairs.values())
            for a in ("--baseline", f"{plain}={','.join(s for s, b in pairs.items() if b == plain)}")]


def check(spec, plain, target: str, path: Path) -> int:
    """`specdec check --endpoint` of `spec` against `plain`, its JSON into `path`."""
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = specdec(["check", "--endpoint", f"spec={spec.url}/v1/completions", "--reference",
                        f"plain={plain.url}/v1/completions", "--target", target, "--tokens", "128", "--prompts", "6",
                        "--json"])
    path.write_text(text.getvalue())
    return code


def log_of(out: Path, name: str, parallel: int) -> Path:
    """A server's log in --out; one per slot count, so that runs at several -np keep theirs."""
    return out / (f"server-{name}.log" if parallel == 1 else f"server-{name}-np{parallel}.log")


def llama_servers(args: argparse.Namespace, out: Path) -> dict[str, LlamaServer]:
    """A plain and a speculative llama-server (not started yet)."""
    model = gguf_file(args.model)
    draft = None if args.draft == "none" else gguf_file(args.draft) if args.draft else model
    extra = shlex.split(args.server_args)
    context = 4096 * args.parallel  # each slot gets 4096 tokens
    common = dict(threads=args.threads, parallel=args.parallel, context=context)
    return {"llama-plain": LlamaServer(model, args=extra, log=log_of(out, "llama-plain", args.parallel), **common),
            "llama-spec": LlamaServer(model, draft=draft, args=extra + shlex.split(args.spec_args),
                                      log=log_of(out, "llama-spec", args.parallel), **common)}


def specdec_servers(args: argparse.Namespace, out: Path) -> dict[str, SpecdecServer]:
    """A plain (`--proposer ar`) and a speculative (`--proposer` --spec-proposer) specdec serve (not
    started yet), on --model and --draft (default: the registry's default draft)."""
    base = ["--target", args.model, *(["--draft", args.draft] if args.draft and args.draft != "none" else []),
            *shlex.split(args.specdec_args)]
    return {"specdec-plain": SpecdecServer([*base, "--proposer", "ar"], log=log_of(out, "specdec-plain", args.parallel)),
            "specdec-spec": SpecdecServer([*base, "--proposer", args.spec_proposer],
                                          log=log_of(out, "specdec-spec", args.parallel))}


def vllm_servers(args: argparse.Namespace, out: Path) -> dict[str, VllmServer]:
    """A plain vLLM server and one per --spec-config (not started yet)."""
    folder = converted_folder(REGISTRY[args.model])
    extra = shlex.split(args.server_args)
    servers = {"vllm-plain": VllmServer(folder, threads=args.threads, args=extra,
                                        log=log_of(out, "vllm-plain", args.parallel))}
    for text in args.spec_config:
        try:
            config = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict) or "method" not in config:
            raise SpecdecError(f"--spec-config {text!r} is not a JSON object with a method: give vLLM's "
                               "speculative_config as `specdec advise --export vllm --json` prints it (settings)")
        if config.get("model") in REGISTRY:
            config["model"] = str(converted_folder(REGISTRY[config["model"]]))
        name = f"vllm-{config['method']}"
        if name in servers:
            raise SystemExit(f"two --spec-config with method {config['method']}: one server each method")
        servers[name] = VllmServer(folder, speculative=config, threads=args.threads, args=extra,
                                   log=log_of(out, name, args.parallel))
    return servers


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecdecError as e:  # vLLM not installed, a folder it cannot load, a server that did not start
        print(f"serving_bench: error: {e}", file=sys.stderr)
        sys.exit(2)
