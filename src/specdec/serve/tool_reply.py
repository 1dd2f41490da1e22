"""A chat reply with tools in OpenAI's shape: the whole message's `content` and `tool_calls`, or
the stream's deltas (content; a call's index, id and name with empty arguments; then fragments
of its arguments), both from the same parser (serve.tool_calls), so the openai client's
reassembly of the stream equals the whole message."""

from __future__ import annotations

from .tool_calls import CallParser, Piece
from .tools import ToolUse


class ToolReply:
    def __init__(self, use: ToolUse):
        names = frozenset(t["function"]["name"] for t in use.tools.tools)
        self.parser = CallParser(use.form, use.tools.parallel, use.head, names)

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def message(self, text: str) -> dict:
        """The whole reply's message fields (without its role)."""
        content = "".join(p.content for p in self.parser.feed(text) + self.parser.finish())
        if not self.called:
            return {"content": content}
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in self.parser.calls]
        return {"content": content or None, "tool_calls": calls}

    def deltas(self, text: str) -> list[dict]:
        """The stream deltas the reply's next text releases."""
        return stream_deltas(self.parser.feed(text))

    def last_deltas(self) -> list[dict]:
        return stream_deltas(self.parser.finish())


def stream_deltas(pieces: list[Piece]) -> list[dict]:
    """Content pieces joined, each call's start a delta of its own, the fragments that follow it
    joined."""
    out: list[dict] = []
    for piece in pieces:
        last = out[-1] if out else {}
        if piece.content:
            if "content" in last:
                last["content"] += piece.content
            else:
                out.append({"content": piece.content})
        elif piece.start is not None:
            call = piece.start
            out.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})
        elif piece.arguments:
            entry = last.get("tool_calls", [{}])[0]
            if entry.get("index") == piece.index and "id" not in entry:
                entry["function"]["arguments"] += piece.arguments
            else:
                out.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.arguments}}]})
    return out
