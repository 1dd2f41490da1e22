"""Running the application on uvicorn: the worker starts loading at once (GET /health answers
503 until it is ready), Ctrl-C and SIGTERM stop the worker (new requests refused, running ones
given --shutdown-timeout seconds to finish) and then uvicorn, which waits for their replies;
a model that fails to load, or a decode worker that dies, stops the server with its error."""

from __future__ import annotations

import ipaddress
import socket
import sys

import uvicorn

from .app import Settings, create_app
from .worker import DecodeWorker


class Server(uvicorn.Server):
    """uvicorn's server, which also stops the decode worker when told to exit, so the streams in
    progress end within the worker's shutdown timeout instead of holding the shutdown."""

    def __init__(self, config: uvicorn.Config, worker: DecodeWorker):
        super().__init__(config)
        self.worker = worker

    def handle_exit(self, sig, frame) -> None:
        self.worker.stop()
        super().handle_exit(sig, frame)


def build(worker: DecodeWorker, settings: Settings, host: str, port: int, log_level: str = "info") -> Server:
    config = uvicorn.Config(create_app(worker, settings), host=host, port=port, log_level=log_level,
                            access_log=log_level == "debug", lifespan="on",
                            timeout_graceful_shutdown=worker.limits.shutdown_timeout + 5)  # the replies' last events
    server = Server(config, worker)

    def failed(error: BaseException) -> None:
        print(f"specdec: error: the model did not load: {error}", file=sys.stderr, flush=True)
        server.should_exit = True

    def died(reason: str) -> None:
        print(f"specdec: error: the decode worker died ({reason}): stopping", file=sys.stderr, flush=True)
        server.should_exit = True

    worker.on_load_failure, worker.on_death = failed, died
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
