"""A model's reply text -> content and tool calls, as the text grows (streamed) or at once.

The formats the chat templates of the supported families ask for:
- HERMES (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  any number of them, text before the first being the reply's content;
- LLAMA3 (Llama 3.x's JSON tool calls): the reply is `{"name": ..., "parameters": {...}}` itself.

A HERMES reply may also open with a call without its tag, `{"name": ..., "arguments": ...}` or
with the braces doubled (`{{...}}`, Qwen2.5's template writes its example so): small models
write that after a first call, and llama.cpp's and vLLM's hermes parsers read it too. Such a
bare call is read only where its name is one of the request's functions (`names`), so that a
reply that is a JSON object of its own stays content.

One parser serves both the whole reply and the stream, so a streamed reply reassembles to the
same message. A call is announced (index, id, name) once its head `{"name": "...", "arguments":`
is read, then its arguments follow as their text arrives, ended by a JSON scanner at the end of
the arguments' value (the model's own text, as OpenAI gives it: not re-encoded). Text that could
still become a call (a part of `<tool_call>`, whitespace before it) is held back until the next
text decides; a reply without calls comes out as its text exactly.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from .tool_json import WHITESPACE as _WHITESPACE
from .tool_json import JsonValue, read_head, tag_prefix


@dataclass(frozen=True)
class CallFormat:
    name: str
    open: str  # what starts a call ("" where the call stands alone at the start of the reply)
    close: str  # what ends one ("" where the end of the JSON object does)
    arguments_key: str  # the key the template writes arguments under

    def head(self, function: str | None) -> str:
        """The start of a call, to put after the prompt where a call is required (a named
        function's up to its arguments; else up to the name's opening quote)."""
        start = f'{self.open}\n{{"name": "' if self.open else '{"name": "'
        return start if function is None else f'{start}{function}", "{self.arguments_key}": '


HERMES = CallFormat("hermes", "<tool_call>", "</tool_call>", "arguments")
LLAMA3 = CallFormat("llama3", "", "", "parameters")


@dataclass
class Call:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True)
class Piece:
    """What the parser releases: content text, or a call's announcement (`start`: the Call,
    arguments still empty) or a fragment of its arguments (`index`, `arguments`)."""

    content: str = ""
    start: Call | None = None
    index: int | None = None
    arguments: str = ""


class CallParser:
    """Feed it the reply's text as it grows; it returns the pieces that text releases."""

    def __init__(self, form: CallFormat, parallel: bool = True, start: str = "",
                 names: frozenset[str] | None = None):
        self.form, self.parallel, self.names = form, parallel, names
        self.calls: list[Call] = []
        self._buffer = start  # text read but not yet released (a head forced in the prompt starts here)
        self._state = "content"  # content, head, arguments, after, collect, done
        self._value: JsonValue | None = None
        self._at_start = True  # no text but whitespace yet (a bare call must open the reply)
        self._gap = ""  # HERMES: the whitespace before an open tag, given back if no call follows
        self._opened = ""  # the open tag the call being read began with ("" for a bare call)
        self._braces = 1  # the closing braces a bare call ends with (2 where it opened with `{{`)

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Piece]:
        """The pieces left at the end of the reply (held text, an unfinished call)."""
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self._state == "collect":
            self._collected(out, self._buffer)
        elif self._state == "head":  # the reply ended inside what was not yet a call
            out.append(Piece(content=self._gap + self._opened + self._buffer))
        elif self._state == "content" and self._buffer and (not self.calls or self._buffer.strip(_WHITESPACE)):
            out.append(Piece(content=self._buffer))
        self._buffer = ""
        return out

    # --- states: each step consumes some of the buffer and says whether to go on ------------

    def _step(self, out: list[Piece], final: bool) -> bool:
        return getattr(self, f"_{self._state}")(out, final)

    def _content(self, out: list[Piece], final: bool) -> bool:
        buf = self._buffer
        if self._at_start:  # a bare call only where the reply (or the previous bare call) starts
            if buf.lstrip(_WHITESPACE).startswith("{"):
                self._state, self._opened = "head", ""  # the head's reader skips the whitespace, and gives it back if no call
                return True
            if not buf.strip(_WHITESPACE):
                return False
            self._at_start = False
        if not self.form.open:  # LLAMA3: no calls but bare ones
            self._release(out, buf)
            self._buffer = ""
            return False
        at = buf.find(self.form.open)
        if at >= 0:
            before = buf[:at].rstrip(_WHITESPACE)
            self._release(out, before)
            self._gap, self._buffer, self._state = buf[len(before):at], buf[at + len(self.form.open):], "head"
            self._opened = self.form.open
            return True
        held = tag_prefix(buf, self.form.open)
        kept = len(buf[: len(buf) - held].rstrip(_WHITESPACE))
        if final:
            return False
        self._release(out, buf[:kept])
        self._buffer = buf[kept:]
        return False

    def _head(self, out: list[Piece], final: bool) -> bool:
        untagged = bool(self.form.open) and not self._opened  # a HERMES call without its tag
        skip = self._buffer.index("{") + 1 if untagged and self._buffer.lstrip(_WHITESPACE).startswith("{{") else 0
        read = read_head(self._buffer[skip:], self.form.arguments_key)
        if read is None:  # needs more text
            return False
        if read is not False and untagged and self.names is not None and read[0] not in self.names:
            read = False  # a JSON object of the reply's own, not a call
        if read is False:  # not a head in this order: a tagged call is read whole at its close
            if self._opened:
                self._state = "collect"
            else:
                self._state, self._at_start = "content", False
            return True
        name, end = read[0], read[1] + skip
        self._braces = 2 if skip else 1
        call = Call(len(self.calls), _call_id(), name)
        self.calls.append(call)
        out.append(Piece(start=Call(call.index, call.id, name)))
        self._buffer, self._state, self._value = self._buffer[end:], "arguments", JsonValue()
        return True

    def _arguments(self, out: list[Piece], final: bool) -> bool:
        used = self._value.take(self._buffer)
        if used:
            call = self.calls[-1]
            call.arguments += self._buffer[:used]
            out.append(Piece(index=call.index, arguments=self._buffer[:used]))
            self._buffer = self._buffer[used:]
        if not self._value.done:
            return False
        self._state = "after"
        return True

    def _after(self, out: list[Piece], final: bool) -> bool:
        """Past a call's arguments: drop the rest of the call (its closing brace and tag)."""
        if self._opened:
            at = self._buffer.find(self.form.close)
            if at < 0:
                return False
            self._buffer = self._buffer[at + len(self.form.close):]
        else:  # a bare call: its closing braces, then the `;` or whitespace before the next
            rest = self._buffer.lstrip(_WHITESPACE)
            if not rest:
                return False
            if rest[0] == "}" and self._braces:
                self._buffer, self._braces = rest[1:], self._braces - 1
                return True
            self._buffer, self._at_start = rest.lstrip(_WHITESPACE + ";"), True
        self._state = "content" if self.parallel else "done"
        return True

    def _collect(self, out: list[Piece], final: bool) -> bool:
        at = self._buffer.find(self.form.close)
        if at < 0:
            return False
        body, self._buffer = self._buffer[:at], self._buffer[at + len(self.form.close):]
        self._collected(out, body, closed=True)
        return True

    def _done(self, out: list[Piece], final: bool) -> bool:
        self._buffer = ""  # parallel_tool_calls false: nothing after the first call
        return False

    # --- helpers ---------------------------------------------------------------------------

    def _release(self, out: list[Piece], text: str) -> None:
        if text:
            out.append(Piece(content=text))

    def _collected(self, out: list[Piece], body: str, closed: bool = False) -> None:
        """A HERMES call read whole (its keys not in the usual order): a call if it is one,
        else its text as content."""
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        key = self.form.arguments_key
        if isinstance(value, dict) and isinstance(value.get("name"), str) and key in value:
            arguments = value[key] if isinstance(value[key], str) else json.dumps(value[key], ensure_ascii=False)
            call = Call(len(self.calls), _call_id(), value["name"], arguments)
            self.calls.append(call)
            out += [Piece(start=Call(call.index, call.id, call.name)), Piece(index=call.index, arguments=arguments)]
            self._state = "content" if self.parallel else "done"
        else:
            out.append(Piece(content=self._gap + self.form.open + body + (self.form.close if closed else "")))
            self._state = "content"


def parse_reply(form: CallFormat, text: str, parallel: bool = True, start: str = "",
                names: frozenset[str] | None = None) -> tuple[str | None, list[Call]]:
    """The whole reply's content (None where it is only calls) and calls."""
    parser = CallParser(form, parallel, start, names)
    pieces = parser.feed(text) + parser.finish()
    content = "".join(p.content for p in pieces)
    return (content or None) if parser.calls else content, parser.calls


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
