"""The grammar (specdec.constrain, llguidance's Lark) that holds a reply's tool calls to the
request's functions: each call's name one of theirs and its arguments valid under that
function's parameters schema.

- tool_choice "required" or a named function: the prompt already ends with the call's head
  (ToolUse.head), so the grammar starts inside the call: the name and arguments (or, named, the
  arguments), then the call's end, and then the reply ends (one call).
- "auto": free text, in which the model's own open tag starts a constrained call (llama.cpp's
  lazy grammar). This needs the tag to be one token of the tokenizer (Qwen2.5's `<tool_call>`
  is), so that free text cannot spell it; where it is not, or in the Llama 3.x format (whose call
  is a bare JSON object), "auto" calls are parsed but not constrained.

Tags that are one token are written as that token (`<[id]>`), as the model writes them.
"""

from __future__ import annotations

import json

from ..constrain import Grammar, lark
from ..constrain.grammars import WHITESPACE
from ..errors import SpecdecError
from .errors import invalid
from .tools import ToolUse


def tool_grammar(use: ToolUse) -> Grammar | None:
    """The grammar of `use`'s reply, or None where its calls are not constrained."""
    form, tools = use.form, use.tools
    required = tools.choice == "required"
    if not required and (use.open_id is None or not form.open):
        return None
    functions = {t["function"]["name"]: t["function"] for t in tools.tools}
    close = f'"}}\\n" {_tag(form.close, use.close_id)}' if form.close else '"}"'
    key = form.arguments_key
    named = [_text(name + '", "' + key + '": ') + " " + _json(f) for name, f in functions.items()]
    rules = [f"call_rest: ({' | '.join(named)}) {close}"]
    if required:
        start = f"start: {_json(functions[tools.function])} {close}" if tools.function else "start: call_rest"
    else:
        rules += [f'call: {_tag(form.open, use.open_id)} "\\n{{\\"name\\": \\"" call_rest', "tail: TEXT",
                  "TEXT: /(.|\\n)*/", "call_after_text: TEXT call"]
        start = f"start: call_after_text{'*' if tools.parallel else '?'} tail"
    try:
        return lark("\n".join([start, *rules]), "the tool calls' grammar")
    except SpecdecError as e:
        raise invalid(str(e), "tools", "invalid_schema") from None


def _json(function: dict) -> str:
    """llguidance's embedded JSON schema of a function's arguments (whitespace bounded as the
    constrain package bounds it)."""
    schema = function.get("parameters") or {"type": "object"}
    return f"%json {json.dumps(schema | {'x-guidance': {'whitespace_pattern': WHITESPACE}})}"


def _text(text: str) -> str:
    return json.dumps(text)


def _tag(tag: str, token: int | None) -> str:
    return f"<[{token}]>" if token is not None else _text(tag)
