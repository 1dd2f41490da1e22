"""Who may reach the server from a web browser. A page the user visits can send requests to any
address, the server's loopback one included: browsers mark them with an Origin header, so a
request with an Origin the server was not told to allow (--allowed-origins) is refused with 403;
allowed origins get CORS headers and their preflights answered (Starlette's CORSMiddleware).
A page can also reach a loopback server under a name of its own that resolves to 127.0.0.1 (DNS
rebinding): its requests then carry that name as Host, so a loopback server refuses Host names
other than its own unless --allowed-hosts lists them. Ollama guards the same way
(OLLAMA_ORIGINS, its allowed-hosts check). Clients outside browsers (curl, the openai package)
send no Origin and are not affected."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import ApiError

ANY = "*"


@dataclass(frozen=True)
class Sites:
    """The origins and Host names the server answers: `origins` ("*": any; none: requests with an
    Origin are refused), `hosts` (None: a loopback server's own names only, any name on another
    address; "*": any) and `bound`, the address the server listens on."""

    origins: tuple[str, ...] = ()
    hosts: tuple[str, ...] | None = None
    bound: str | None = None

    def origin_allowed(self, origin: str) -> bool:
        return ANY in self.origins or origin.rstrip("/").lower() in self.origins

    def host_allowed(self, host: str) -> bool:
        if self.hosts is None and not (self.bound and _loopback(self.bound)):
            return True  # served beyond loopback: Host names are whatever clients use for it
        name = host_name(host)
        hosts = self.hosts or ()
        return ANY in hosts or name in hosts or _loopback(name) or name == (self.bound or "").lower()


def parse_origins(text: str | None) -> tuple[str, ...]:
    """--allowed-origins: a comma list of origins (scheme://host[:port]), "null" or "*"."""
    origins = tuple(o.strip().rstrip("/").lower() for o in (text or "").split(",") if o.strip())
    for origin in origins:
        parts = urlsplit(origin)
        if origin not in (ANY, "null") and not (parts.scheme and parts.netloc and not parts.path):
            raise ValueError(f"--allowed-origins takes origins such as http://localhost:3000 (scheme://host[:port], "
                             f"no path), null or *, comma separated; got {origin!r}")
    return origins


def parse_hosts(text: str | None) -> tuple[str, ...] | None:
    """--allowed-hosts: a comma list of Host names (a port, if given, is ignored), or "*"; None
    when the flag is absent."""
    if text is None:
        return None
    return tuple(host_name(h) if h.strip() != ANY else ANY for h in text.split(",") if h.strip())


def host_name(host: str) -> str:
    """A Host header's name: no port, no IPv6 brackets, lower case, no trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


class SiteGuard:
    """ASGI middleware: 403 for a request whose Origin or Host the server does not answer."""

    def __init__(self, app, sites: Sites, metrics):
        self.app, self.sites, self.metrics = app, sites, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        error = self._refusal(headers.get(b"origin"), headers.get(b"host"))
        if error is None:
            return await self.app(scope, receive, send)
        self.metrics.reject("forbidden")
        await error.response()(scope, receive, send)

    def _refusal(self, origin: bytes | None, host: bytes | None) -> ApiError | None:
        if origin is not None and not self.sites.origin_allowed(origin.decode("latin-1")):
            return ApiError(403, f"requests from the web origin {origin.decode('latin-1')[:80]!r} are refused: a web "
                                 "page may not use this server unless it was started with --allowed-origins listing "
                                 "that origin (clients outside a browser send no Origin header)",
                            code="origin_not_allowed")
        if host is not None and not self.sites.host_allowed(host.decode("latin-1")):
            return ApiError(403, f"the Host {host.decode('latin-1')[:80]!r} is not this server's: a loopback server "
                                 "answers localhost, 127.0.0.1 and [::1]; start it with --allowed-hosts NAME to "
                                 "answer another name", code="host_not_allowed")
        return None
