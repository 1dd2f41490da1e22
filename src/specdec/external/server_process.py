"""A local server's process, for the servers specdec starts to measure (llama-server, vLLM,
llama-cpp-python's server): a free loopback port, the process in its own group with its output
in a log, a bounded wait until it answers, and a stop that ends the whole group.

Why a process group: vLLM's API server starts an engine-core process (and llama-cpp-python's
server may fork); signalling the group leaves none of them behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from ..errors import SpecdecError

STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`command` run with `env` (None: this process's), its output to `log` (None: a temporary
    file, kept for the error messages); ready when GET `ready_path` answers 200."""

    def __init__(self, name: str, command: list[str], ready_path: str, timeout_s: float,
                 env: dict[str, str] | None = None, log: Path | None = None):
        self.name, self.command, self.ready_path, self.timeout_s, self.env = name, command, ready_path, timeout_s, env
        self.log = log or Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    def start(self, url: str) -> None:
        """Start it and wait until `url` + ready_path answers; stopped again if it does not."""
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        try:
            self._wait_ready(url)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL if it has not ended in time; then SIGKILL to what
        is left of the group (a child that outlived its parent)."""
        if self.process is None or self.process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        self._signal(signal.SIGKILL)

    def log_tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return " | ".join(line.strip() for line in lines if line.strip())

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def _wait_ready(self, url: str) -> None:
        """Until the ready path answers 200, the process dies, or the time is up."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecdecError(f"{self.name} exited with {self.process.returncode} at start (log {self.log}): "
                                   f"{self.log_tail()}")
            try:
                if httpx.get(url + self.ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise SpecdecError(f"{self.name} was not ready after {self.timeout_s:.0f} s (log {self.log}): {self.log_tail()}")
