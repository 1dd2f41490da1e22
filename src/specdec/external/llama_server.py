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
from .server_process import ServerProcess, free_port

START_TIMEOUT_S = 120.0


def binary() -> Path:
    """The newest llama-server in the cache (SPECDEC_LLAMA_SERVER names another)."""
    if os.environ.get("SPECDEC_LLAMA_SERVER"):
        return Path(os.environ["SPECDEC_LLAMA_SERVER"])
    built = sorted((cache_root() / "llama-server").glob("*/llama-server"), key=lambda p: p.stat().st_mtime)
    if not built:
        raise SpecdecError("llama-server is not built: run bash scripts/setup_llama_server.sh")
    return built[-1]


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
