"""OpenAI-style errors: what a client did wrong (or what the server cannot do now), as the JSON
body OpenAI's API and its clients use: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import secrets
import sys
import traceback

# The error types OpenAI's API names per status (its clients map statuses to exception classes).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class ApiError(Exception):
    """A request that gets an error reply: `status`, a message that says what to do, the
    offending field (`param`) and a short machine-readable `code`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self):
        """The error as the HTTP reply (a Starlette JSONResponse, also an ASGI app)."""
        from starlette.responses import JSONResponse

        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400: the request is malformed or asks for something this server does not do."""
    return ApiError(400, message, param, code)


def internal(error: BaseException, what: str = "the server failed on this request") -> ApiError:
    """A 500 for a fault of the server or the model (never the client's): the body says
    "internal error" with an id and no exception text (which may hold paths or request data);
    the log line on stderr carries the same id with the traceback, so an operator finds it."""
    ident = f"err-{secrets.token_hex(6)}"
    trace = "".join(traceback.format_exception(error))
    sys.stderr.write(f"[specdec] internal error {ident}: {what}\n{trace}")
    sys.stderr.flush()
    return ApiError(500, f"internal error {ident}: {what}; the server's log has the details under this id",
                    code="internal_error")
