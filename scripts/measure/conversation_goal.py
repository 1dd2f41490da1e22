"""Issue 53's goals as conversations: `specdec serve` and llama-server (its prompt cache on, as by
default) started here side by side, then one `specdec bench --conversations` over all of them,
each conversation run by every server in rotated order (bench.conversation), into --out with the
servers' logs and command lines (servers.json). The default pair, greedy, 2 threads, each answer
the server's own, the openai client.

Servers (--servers, comma list of these names):
  specdec-plain    specdec serve --proposer ar (the prefix cache on, as by default)
  specdec-auto     specdec serve (--proposer auto: this CPU's saved or default choice, a draft chain
                   with the server's memory of earlier requests: suffix+draft)
  specdec-draft    specdec serve --proposer auto:memory=0 (auto's choice without the memory: the
                   draft alone, what auto ran before it remembered)
  specdec-suffix   specdec serve --proposer suffix+draft with auto's draft options (the memory of
                   earlier requests where it expects k accepted, else the draft)
  specdec-memory   specdec serve --proposer suffix:k=8 (the memory alone, no draft model)
  specdec-nocache  specdec-suffix with --no-prefix-cache: the same answers, every prompt prefilled
  llama-plain      llama-server (the CPU's build, external.llama_server.binary)
  llama-ngram      llama-server --spec-type ngram-mod
  llama-draft      llama-server -md the draft, --spec-type draft-simple, 3 tokens a round

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/conversation_goal.py --out runs/code \\
        --dataset code-edit --limit 3 --servers specdec-suffix,llama-plain,llama-ngram,llama-draft
    flock /tmp/cpu.lock .venv/bin/python scripts/measure/conversation_goal.py --out runs/mt \\
        --dataset mt-bench --per-category 1 --servers specdec-auto,specdec-draft,specdec-memory
    ... --parallel 2 (llama-server's slots, and bench --concurrency 2)

--baseline NAME is bench's (the digest's ratios); summary.json pairs every two servers. A folder
with rows is continued (bench --resume), adding servers named after the stored ones."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from specdec.cli import main as specdec
from specdec.external.llama_server import LlamaServer
from specdec.external.specdec_server import SpecdecServer
from specdec.registry import gguf_file

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
AUTO_DRAFT = "k=4:quant=int3:vocab=32768:conf=0.6"  # auto's draft on an AVX-512 BF16 CPU (tune.saved)
SPECDEC = {"specdec-plain": ["--proposer", "ar"], "specdec-auto": ["--proposer", "auto"],
           "specdec-draft": ["--proposer", "auto:memory=0"],
           "specdec-suffix": ["--proposer", f"suffix+draft:{AUTO_DRAFT}"],
           "specdec-memory": ["--proposer", "suffix:k=8"],
           "specdec-nocache": ["--proposer", f"suffix+draft:{AUTO_DRAFT}", "--no-prefix-cache"]}
LLAMA = {"llama-plain": [], "llama-ngram": ["--spec-type", "ngram-mod"],
         "llama-draft": ["--spec-draft-n-max", "3", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]}


def server(name: str, parallel: int, logs: Path):
    """The named server (not started), its log in `logs`."""
    log = logs / f"server-{name}.log"
    if name in SPECDEC:
        return SpecdecServer(["--target", TARGET, "--draft", DRAFT, "--max-sequences", str(max(parallel, 1)),
                              *SPECDEC[name]], log=log)
    draft = gguf_file(DRAFT) if name == "llama-draft" else None
    return LlamaServer(gguf_file(TARGET), draft=draft, threads=2, context=8192 * parallel, parallel=parallel,
                       args=LLAMA[name], log=log)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--servers", required=True, help=f"comma list of {', '.join([*SPECDEC, *LLAMA])}")
    p.add_argument("--dataset", default="code-edit", help="bench's --dataset (code-edit, mt-bench, spec-bench)")
    p.add_argument("--limit", type=int)
    p.add_argument("--per-category", type=int)
    p.add_argument("--categories")
    p.add_argument("--parallel", type=int, default=1, help="llama-server's slots, specdec's --max-sequences and "
                   "bench's --concurrency")
    p.add_argument("--tokens", type=int, default=256, help="max tokens a turn")
    p.add_argument("--baseline", help="the server the digest compares the others with")
    args = p.parse_args()
    names = args.servers.split(",")
    unknown = [n for n in names if n not in {**SPECDEC, **LLAMA}]
    if unknown:
        raise SystemExit(f"--servers: unknown {', '.join(unknown)}")
    out = Path(args.out)
    resume = (out / "config.json").is_file()
    logs = Path(tempfile.mkdtemp(prefix="conversation-logs-"))  # into --out once bench has accepted it
    servers = {name: server(name, args.parallel, logs) for name in names}
    try:
        return _bench(args, out, resume, servers)
    finally:
        if (out / "config.json").is_file():
            _keep(out, logs, servers)


def _bench(args: argparse.Namespace, out: Path, resume: bool, servers: dict) -> int:
    with ExitStack() as stack:
        for name, s in servers.items():
            stack.enter_context(s)
            print(f"[conversation] {name}: {shlex.join(s.command)}", file=sys.stderr)
        select = [a for flag, value in (("--limit", args.limit), ("--per-category", args.per_category),
                                        ("--categories", args.categories)) if value for a in (flag, str(value))]
        bench = ["bench", "--conversations", "--dataset", args.dataset, *select, "--max-new-tokens", str(args.tokens),
                 "--concurrency", str(args.parallel), "--out", str(out), "--no-progress",
                 *(["--resume"] if resume else []), *(["--baseline", args.baseline] if args.baseline else [])]
        for name, s in servers.items():
            bench += ["--endpoint", f"{name}={s.url}/v1/chat/completions"]
        return specdec(bench)


def _keep(out: Path, logs: Path, servers: dict) -> None:
    """The servers' logs into --out, and each one's command line into servers.json (with those of
    earlier passes over the folder)."""
    for log in logs.iterdir():
        shutil.move(str(log), out / log.name)
    path = out / "servers.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    known.update({name: shlex.join(s.command) for name, s in servers.items()})
    path.write_text(json.dumps(known, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
