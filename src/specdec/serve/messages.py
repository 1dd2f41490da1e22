"""A chat request's `messages` -> the conversation as chat templates take it: roles checked
(developer is the system's), text parts joined, an assistant's `tool_calls` with their arguments
parsed from OpenAI's JSON string into the object the templates write back, a tool message's
`tool_call_id` (and `name`) kept."""

from __future__ import annotations

import json

from .errors import invalid

ROLES = ("system", "developer", "user", "assistant", "tool")


def read_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages is missing: send a list such as [{\"role\": \"user\", \"content\": \"...\"}]",
                      "messages", "missing_prompt")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages",
                      "empty_prompt")
    out = [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
    if not any(m["content"].strip() or m.get("tool_calls") for m in out):
        raise invalid("every message is empty: send some text", "messages", "empty_prompt")
    return out


def _message(message: object, where: str) -> dict:
    if not isinstance(message, dict):
        raise invalid(f"{where} must be an object with role and content", where)
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role must be {', '.join(ROLES[:-1])} or {ROLES[-1]}, got {role!r}", f"{where}.role")
    calls = message.get("tool_calls") if role == "assistant" else None
    out = {"role": "system" if role == "developer" else role,
           "content": _content(message.get("content"), f"{where}.content", role)}
    if calls:
        out["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
    if role == "tool":
        for key in ("tool_call_id", "name"):
            value = message.get(key)
            if value is not None and not isinstance(value, str):
                raise invalid(f"{where}.{key} must be a string", f"{where}.{key}")
            if value is not None:
                out[key] = value
    return out


def _content(content: object, where: str, role: str) -> str:
    """A message's text: a string, or a list of text parts (images and audio are refused)."""
    if content is None and role == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{where} may hold only text parts ({{\"type\": \"text\", \"text\": ...}}): "
                              "this model takes no images or audio", where, "unsupported_content")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"{where} must be a string or a list of text parts", where)


def _tool_calls(calls: object, where: str) -> list[dict]:
    """An assistant's calls as the templates write them back: arguments as an object."""
    if not isinstance(calls, list):
        raise invalid(f"{where} must be a list of {{\"id\", \"type\": \"function\", \"function\"}} objects", where)
    out = []
    for i, call in enumerate(calls):
        at = f"{where}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(f"{at} must be {{\"id\": ..., \"type\": \"function\", \"function\": {{\"name\": ..., "
                          "\"arguments\": \"{...}\"}}}}", at)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as e:
                raise invalid(f"{at}.function.arguments must be a JSON text (as the reply gave it): {e}",
                              f"{at}.function.arguments") from None
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out
