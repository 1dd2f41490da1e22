"""llama.cpp's own HTTP server (llama-server), as built by scripts/setup_llama_server.sh, started
on a free loopback port and stopped again: the real OpenAI-compatible server that the endpoint
tests and docs/serving.md measure, with and without draft-model speculation.

    with LlamaServer(gguf, draft=gguf) as server:      # server.url: http://127.0.0.1:PORT
        ...
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SpecdecError
from ..files import cache_root
from ..machine import cpu_flags
from .server_process import ServerProcess, free_port

START_TIMEOUT_S = 120.0


def builds(tool: str = "llama-server") -> list[Path]:
    """The cached builds of `tool` (llama-server, llama-bench) that this CPU can run, best first:
    the build for this CPU (the most instruction sets its BUILD_INFO `requires:`) before the
    x86-64-v3 one, then the newest. A build needing a set this CPU lacks (a cache restored onto
    another machine) is left out: it would die of SIGILL."""
    have = cpu_flags()
    usable = [(len(need), path.stat().st_mtime, path)
              for path in (cache_root() / "llama-server").glob(f"*/{tool}")
              if (need := _required_flags(path.parent)) <= have]
    return [path for *_, path in sorted(usable, key=lambda item: item[:2], reverse=True)]


def binary(tool: str = "llama-server") -> Path:
    """The best llama-server (or llama-bench) for this CPU in the cache; SPECDEC_LLAMA_SERVER
    names another llama-server."""
    if tool == "llama-server" and os.environ.get("SPECDEC_LLAMA_SERVER"):
        return Path(os.environ["SPECDEC_LLAMA_SERVER"])
    found = builds(tool)
    if not found:
        raise SpecdecError(f"{tool} is not built for this CPU: run bash scripts/setup_llama_server.sh")
    return found[0]


def _required_flags(build: Path) -> set[str]:
    """The /proc/cpuinfo flags a build was compiled for; none for a build older than the record."""
    try:
        lines = (build / "BUILD_INFO").read_text().splitlines()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("requires:")), set())


class LlamaServer:
    """A llama-server process on 127.0.0.1; `args` are passed on (e.g. ["--metrics"])."""

    def __init__(self, model: Path, draft: Path | None = None, threads: int = 2, context: int = 4096,
                 args: list[str] | None = None, log: Path | None = None, parallel: int = 1):
        """`parallel` slots serve that many requests at once (each gets context / parallel)."""
        self.port = free_port()
        self.command = [str(binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                        "-t", str(threads), "-c", str(context), "--parallel", str(parallel), *(args or [])]
        if draft is not None:
            # --spec-type: this llama.cpp speculates only when told which kind (its default is none)
            self.command += ["--model-draft", str(draft), "--spec-type", "draft-simple", "--spec-draft-threads", str(threads)]
        self.server = ServerProcess("llama-server", self.command, "/health", START_TIMEOUT_S, log=log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LlamaServer:
        self.server.start(self.url)  # /health answers 200 once the models are loaded
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.stop()
