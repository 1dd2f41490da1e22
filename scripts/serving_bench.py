"""Start two servers on this machine, one plain and one speculative, llama.cpp's (default) or
vLLM's (--engine vllm), and run `specdec bench --endpoint` (and optionally `specdec check
--endpoint`) against them: the runs behind docs/serving.md. The servers are stopped when the
runs end, whatever happens.

    .venv/bin/python scripts/serving_bench.py --model smollm2-135m-instruct --out runs/serving \\
        -- --dataset humaneval --limit 10 --max-new-tokens 128 --target smollm2-135m-instruct
    .venv/bin/python scripts/serving_bench.py --model qwen2.5-coder-1.5b-instruct \\
        --draft qwen2.5-coder-0.5b-instruct --spec-args "--spec-draft-n-max 2 --spec-draft-p-min 0" --check \\
        --out runs/serving-qwen -- --dataset humaneval --limit 10 --methods ar,draft:k=2:quant=int8

    .venv/bin/python scripts/serving_bench.py --engine vllm --model qwen2.5-coder-1.5b-instruct \\
        --spec-config '{"method": "draft_model", "model": "qwen2.5-coder-0.5b-instruct", "num_speculative_tokens": 2}' \\
        --out runs/vllm-draft -- --dataset humaneval --limit 10

Everything after `--` goes to `specdec bench` (add --methods to run specdec's own methods beside
the servers). llama.cpp: --draft defaults to the model itself; --server-args are passed to both
servers, --spec-args to the speculative one only. vLLM: --spec-config is the speculative server's
speculative_config (`specdec advise --export vllm --json` prints one), a registry name as its
`model` meaning that model's converted folder. The check's JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

from specdec.cli import main as specdec
from specdec.external.llama_server import LlamaServer
from specdec.external.vllm_server import VllmServer
from specdec.models.registry import REGISTRY, converted_folder, gguf_file


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    p.add_argument("--model", required=True, help="registry name of the served model (its GGUF for llama.cpp, "
                   "its converted folder for vLLM)")
    p.add_argument("--draft", help="llama.cpp: registry name of the draft (default: the model itself); none: no draft "
                   "model, the speculative server speculates as --spec-args say (e.g. n-gram lookup)")
    p.add_argument("--spec-args", default="", help="llama.cpp: more llama-server flags for the speculative server, "
                   "e.g. the ones `specdec advise --export llamacpp` prints")
    p.add_argument("--spec-config", help="vLLM: the speculative server's speculative_config JSON")
    p.add_argument("--server-args", default="", help="more server flags for both servers")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=1, help="llama.cpp: server slots (requests served at once), both "
                   "servers; give bench --concurrency the same number (vLLM batches up to 4 by itself)")
    p.add_argument("--out", required=True)
    p.add_argument("--check", action="store_true", help="also run specdec check --endpoint spec --reference plain")
    p.add_argument("--spec-only", action="store_true", help="start the speculative server alone (no baseline, no "
                   "check): where two servers do not fit in memory (vLLM CPU: about 8 GB per 1.5B server)")
    args, bench = p.parse_known_args()
    bench = [a for a in bench if a != "--"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    servers = (vllm_servers if args.engine == "vllm" else llama_servers)(args, out)
    names = ["spec"] if args.spec_only else ["plain", "spec"]
    with ExitStack() as stack:
        started = {name: stack.enter_context(servers[-len(names) + i]) for i, name in enumerate(names)}
        for name, server in started.items():
            print(f"[serving] {name}: {shlex.join(server.command)}", file=sys.stderr)
        endpoints = [a for name, server in started.items() for a in ("--endpoint", f"{name}={server.url}/v1/completions")]
        baseline = [] if args.spec_only else ["--baseline", "plain"]
        code = specdec(["bench", *endpoints, *baseline, "--out", str(out / "bench"), *bench])
        plain, spec = started.get("plain"), started["spec"]
        if args.check and plain and code == 0:
            target = bench[bench.index("--target") + 1] if "--target" in bench else args.model
            code = specdec(["check", "--endpoint", f"spec={spec.url}/v1/completions", "--reference",
                            f"plain={plain.url}/v1/completions", "--target", target, "--tokens", "128",
                            "--prompts", "6", "--json"])
    return code


def llama_servers(args: argparse.Namespace, out: Path) -> list[LlamaServer]:
    """A plain and a speculative llama-server (not started yet)."""
    model = gguf_file(args.model)
    draft = None if args.draft == "none" else gguf_file(args.draft) if args.draft else model
    extra = shlex.split(args.server_args)
    context = 4096 * args.parallel  # each slot gets 4096 tokens
    common = dict(threads=args.threads, parallel=args.parallel, context=context)
    return [LlamaServer(model, args=extra, log=out / "server-plain.log", **common),
            LlamaServer(model, draft=draft, args=extra + shlex.split(args.spec_args), log=out / "server-spec.log",
                        **common)]


def vllm_servers(args: argparse.Namespace, out: Path) -> list[VllmServer]:
    """A plain vLLM server and one with --spec-config (not started yet)."""
    if not args.spec_config:
        raise SystemExit("--engine vllm needs --spec-config JSON (e.g. from specdec advise --export vllm --json)")
    config = json.loads(args.spec_config)
    if config.get("model") in REGISTRY:
        config["model"] = str(converted_folder(REGISTRY[config["model"]]))
    folder = converted_folder(REGISTRY[args.model])
    extra = shlex.split(args.server_args)
    return [VllmServer(folder, threads=args.threads, args=extra, log=out / "server-plain.log"),
            VllmServer(folder, speculative=config, threads=args.threads, args=extra, log=out / "server-spec.log")]


if __name__ == "__main__":
    sys.exit(main())
