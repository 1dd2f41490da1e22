"""Running the application on uvicorn: the worker starts loading at once (GET /health answers
503 until it is ready), Ctrl-C and SIGTERM stop the worker (the running request ends at its next
round) and then uvicorn, and a model that fails to load stops the server with its error."""

from __future__ import annotations

import ipaddress
import socket
import sys

import uvicorn

from .app import Settings, create_app
from .worker import DecodeWorker


class Server(uvicorn.Server):
    """uvicorn's server, which also stops the decode worker when told to exit, so a stream in
    progress ends at its next round instead of holding the shutdown."""

    def __init__(self, config: uvicorn.Config, worker: DecodeWorker):
        super().__init__(config)
        self.worker = worker

    def handle_exit(self, sig, frame) -> None:
        self.worker.stop()
        super().handle_exit(sig, frame)


def build(worker: DecodeWorker, settings: Settings, host: str, port: int, log_level: str = "info") -> Server:
    config = uvicorn.Config(create_app(worker, settings), host=host, port=port, log_level=log_level,
                            access_log=log_level == "debug", timeout_graceful_shutdown=10, lifespan="on")
    server = Server(config, worker)

    def failed(error: BaseException) -> None:
        print(f"specdec: error: the model did not load: {error}", file=sys.stderr, flush=True)
        server.should_exit = True

    worker.on_load_failure = failed
    return server


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port; read it from getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock
