"""specdec's own server (`specdec serve`) as a process to measure, started on a free loopback port
and stopped again, as llama-server is (external.llama_server): what `specdec bench --serve` and
scripts/serving_bench.py --engine specdec start.

    with SpecdecServer(["--target", T, "--draft", D, "--proposer", "ar"]) as server:
        ...                                             # server.url: http://127.0.0.1:PORT

Ready when GET /health answers 200, which `specdec serve` does once its models are loaded and
warmed up (503 before); a server that exits at start (a model that does not load) is a one-line
error with its log's last lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .server_process import ServerProcess, free_port

# The first start on a GGUF pair reads the files (about a minute on 2 cores), later ones load a cache.
START_TIMEOUT_S = 900.0


class SpecdecServer:
    """`specdec serve OPTIONS` on 127.0.0.1 (OPTIONS: serve's own, e.g. --target, --proposer),
    run by `python` (default: this interpreter) with `env` (default: this process's)."""

    def __init__(self, options: list[str], log: Path | None = None, python: str = sys.executable,
                 env: dict[str, str] | None = None, timeout_s: float = START_TIMEOUT_S):
        self.port = free_port()
        self.command = [python, "-m", "specdec.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                        *options]
        self.server = ServerProcess("specdec serve", self.command, "/health", timeout_s, env=env, log=log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.server.log

    def __enter__(self) -> SpecdecServer:
        self.server.start(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.stop()
