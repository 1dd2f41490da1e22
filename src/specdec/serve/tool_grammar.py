"""The grammar (specdec.constrain, llguidance's Lark) that holds a reply's tool calls to the
request's functions: each call's name one of theirs and its arguments valid under that
function's parameters schema.

- tool_choice "required" or a named function: the prompt already ends with the call's head
  (ToolUse.head), so the grammar starts inside the call: the name and arguments (or, named, the
  arguments), then the call's end, and then the reply ends (one call). A response format then
  holds a later turn's answer, not this one.
- "auto": free text, in which the model's own open tag starts a constrained call (llama.cpp's
  lazy grammar). This needs the tag to be one token of the tokenizer (Qwen2.5's `<tool_call>`
  is), so that free text cannot spell it; where it is not, or in the Llama 3.x format (whose call
  is a bare JSON object), "auto" calls are parsed but not constrained.
- "auto" with a JSON response format (the OpenAI Agents SDK sends one with tools when an agent
  has an output type): no free text, but one of three things from the first token: calls (each
  with its open tag), one call written bare (`{"name": ..., "arguments": ...}`, as small Qwen
  models write a later call, and the Llama 3.x format's only call), or the answer, a JSON value
  under the format's schema. The tag need not be one token here (no free text can spell it).

Tags that are one token are written as that token (`<[id]>`), as the model writes them.
"""

from __future__ import annotations

import json

from ..constrain import Grammar, lark
from ..constrain.grammars import bounded
from ..errors import SpecdecError
from .errors import invalid
from .tools import ToolUse


def tool_grammar(use: ToolUse, answer: Grammar | None = None) -> Grammar | None:
    """The grammar of `use`'s reply, or None where its calls are not constrained (and there is
    no `answer`: the response format's grammar, which must then be a JSON one)."""
    form, tools = use.form, use.tools
    required = tools.choice == "required"
    if answer is not None and answer.schema is None:
        raise invalid(f"{answer.what} together with tools is not supported: the answer beside tool calls can only "
                      "be JSON (response_format json_schema or json_object, json_schema, guided_json)",
                      "tools", "conflicting_parameters")
    if not required and answer is None and (use.open_id is None or not form.open):
        return None
    functions = {t["function"]["name"]: t["function"] for t in tools.tools}
    close = f'"}}\\n" {_tag(form.close, use.close_id)}' if form.close else '"}"'
    key = form.arguments_key
    named = [_text(name + '", "' + key + '": ') + " " + _json(f) for name, f in functions.items()]
    rules = [f"call_rest: ({' | '.join(named)}) {close}"]
    if form.open:
        rules.append(f'call: {_tag(form.open, use.open_id)} "\\n{{\\"name\\": \\"" call_rest')
    if required:
        start = f"start: {_json(functions[tools.function])} {close}" if tools.function else "start: call_rest"
    elif answer is None:
        rules += ["tail: TEXT", "TEXT: /(.|\\n)*/", "call_after_text: TEXT call"]
        start = f"start: call_after_text{'*' if tools.parallel else '?'} tail"
    else:
        rules += _answer_or_calls(answer, functions, key, tagged=bool(form.open), parallel=tools.parallel)
        start = "start: answer | bare" + (" | calls" if form.open else "")
    try:
        return lark("\n".join([start, *rules]), "the tool calls' grammar")
    except SpecdecError as e:
        raise invalid(str(e), "tools", "invalid_schema") from None


def _answer_or_calls(answer: Grammar, functions: dict, key: str, tagged: bool, parallel: bool) -> list[str]:
    """The rules of the answer, a bare call and (`tagged`) calls with their tags. The bare call
    is a JSON value of its own (one schema per function: its name a constant, then its
    arguments), since llguidance cannot choose between an embedded JSON value and a literal that
    both start with `{`."""
    bare = [f"%json {json.dumps(_bare_call(name, f, key))}" for name, f in functions.items()]
    rules = [f"answer: %json {json.dumps(answer.schema)}", f"bare: {' | '.join(bare)}"]
    if tagged:
        rules += ["calls: call (SEP? call)*" if parallel else "calls: call", 'SEP: /\\n{1,2}/']
    return rules


def _bare_call(name: str, function: dict, key: str) -> dict:
    """The schema of `{"name": name, key: arguments}`, spaced as the templates write calls
    (`, ` and `: `, no other whitespace: a small model may otherwise pad its first gaps to the
    token limit), the arguments' definitions moved to its root (where their `#/$defs/...`
    references point)."""
    parameters = dict(function.get("parameters") or {"type": "object"})
    defs = {k: parameters.pop(k) for k in ("$defs", "definitions") if k in parameters}
    return {**defs, "type": "object", "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key], "additionalProperties": False,
            "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}


def _json(function: dict) -> str:
    """llguidance's embedded JSON schema of a function's arguments (whitespace bounded as the
    constrain package bounds it)."""
    return f"%json {json.dumps(bounded(function.get('parameters') or {'type': 'object'}))}"


def _text(text: str) -> str:
    return json.dumps(text)


def _tag(tag: str, token: int | None) -> str:
    return f"<[{token}]>" if token is not None else _text(tag)
