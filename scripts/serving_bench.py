"""Start two llama.cpp servers on this machine, one plain and one with draft-model speculation,
and run `specdec bench --endpoint` (and optionally `specdec check --endpoint`) against them:
the runs behind docs/serving.md. The servers are stopped when the runs end, whatever happens.

    .venv/bin/python scripts/serving_bench.py --model smollm2-135m-instruct --out runs/serving \\
        -- --dataset humaneval --limit 10 --max-new-tokens 128 --target smollm2-135m-instruct
    .venv/bin/python scripts/serving_bench.py --model qwen2.5-coder-1.5b-instruct \\
        --draft qwen2.5-coder-0.5b-instruct --spec-args "--spec-draft-n-max 2 --spec-draft-p-min 0" --check \\
        --out runs/serving-qwen -- --dataset humaneval --limit 10 --methods ar,draft:k=2:quant=int8

Everything after `--` goes to `specdec bench` (add --methods to run specdec's own methods beside
the servers). --draft defaults to the model itself; --server-args are passed to both servers,
--spec-args to the speculative one only. The check's JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specdec.cli import main as specdec
from specdec.external.llama_server import LlamaServer
from specdec.models.registry import gguf_file


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="registry name of the served model (its GGUF)")
    p.add_argument("--draft", help="registry name of the draft (default: the model itself); none: no draft "
                   "model, the speculative server speculates as --spec-args say (e.g. n-gram lookup)")
    p.add_argument("--spec-args", default="", help="more llama-server flags for the speculative server, e.g. the "
                   "ones `specdec advise --export llamacpp` prints")
    p.add_argument("--server-args", default="", help="more llama-server flags for both servers")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=1, help="server slots (requests served at once), both servers; "
                   "give bench --concurrency the same number")
    p.add_argument("--out", required=True)
    p.add_argument("--check", action="store_true", help="also run specdec check --endpoint spec --reference plain")
    args, bench = p.parse_known_args()
    bench = [a for a in bench if a != "--"]
    model = gguf_file(args.model)
    draft = None if args.draft == "none" else gguf_file(args.draft) if args.draft else model
    extra = shlex.split(args.server_args)
    spec_extra = extra + shlex.split(args.spec_args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    context = 4096 * args.parallel  # each slot gets 4096 tokens
    with LlamaServer(model, threads=args.threads, args=extra, log=out / "server-plain.log", parallel=args.parallel,
                     context=context) as plain, \
            LlamaServer(model, draft=draft, threads=args.threads, args=spec_extra, log=out / "server-spec.log",
                        parallel=args.parallel, context=context) as spec:
        for name, server in (("plain", plain), ("spec", spec)):
            print(f"[serving] {name}: {shlex.join(server.command)}", file=sys.stderr)
        endpoints = ["--endpoint", f"plain={plain.url}/v1/completions", "--endpoint", f"spec={spec.url}/v1/completions"]
        code = specdec(["bench", *endpoints, "--baseline", "plain", "--out", str(out / "bench"), *bench])
        if args.check and code == 0:
            target = bench[bench.index("--target") + 1] if "--target" in bench else args.model
            code = specdec(["check", "--endpoint", f"spec={spec.url}/v1/completions", "--reference",
                            f"plain={plain.url}/v1/completions", "--target", target, "--tokens", "128",
                            "--prompts", "6", "--json"])
    return code


if __name__ == "__main__":
    sys.exit(main())
