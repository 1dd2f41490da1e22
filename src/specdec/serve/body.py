"""A POST's body as JSON, refused before it is parsed where it could hurt: a Content-Type other
than application/json is 415 (a web page may POST text/plain to any address without asking
first, CORS's "simple request"; JSON needs a preflight the server answers only for origins it
allows), a body over the limit 413, nesting deeper than MAX_DEPTH 400 (Python's parser recurses:
past its recursion limit it raises RecursionError, and deep values break whatever walks them
later), and text that is not JSON 400."""

from __future__ import annotations

import json
import re

import numpy as np
from starlette.requests import Request

from .errors import ApiError, invalid

MAX_DEPTH = 64  # arrays and objects inside each other; a chat request needs 5 (body, messages, message, parts, part)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, np.int64)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


async def read_json(request: Request, limit: int) -> object:
    """The body as JSON (see the module docstring for what is refused)."""
    media = request.headers.get("content-type", "")
    if media.partition(";")[0].strip().lower() != "application/json":
        raise ApiError(415, f"the request body must be JSON sent with the header Content-Type: application/json "
                            f"(got {media[:60] or 'no Content-Type'})", code="unsupported_media_type")
    data = await _read(request, limit)
    if not data.strip():
        raise invalid("the request body is empty: send a JSON object", code="invalid_json")
    depth = nesting(data)
    if depth > MAX_DEPTH:
        raise invalid(f"the request body nests arrays and objects {depth} deep; at most {MAX_DEPTH} are taken",
                      code="invalid_json")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON ({e}): send a JSON object", code="invalid_json") from None


def nesting(data: bytes) -> int:
    """How deep arrays and objects nest in JSON text (brackets inside strings not counted), in C
    and numpy speed: an 8 MiB body is read in milliseconds."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(_STEP[np.frombuffer(brackets, np.uint8)]).max())


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the request body is over {limit} bytes: send a shorter prompt (the server's "
                              "--max-body-bytes)", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
