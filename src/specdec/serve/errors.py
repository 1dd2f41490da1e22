"""OpenAI-style errors: what a client did wrong (or what the server cannot do now), as the JSON
body OpenAI's API and its clients use: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

# The error types OpenAI's API names per status (its clients map statuses to exception classes).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
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


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400: the request is malformed or asks for something this server does not do."""
    return ApiError(400, message, param, code)
