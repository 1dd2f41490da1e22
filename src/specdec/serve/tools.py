"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls` -> Tools, each checked (a
function's parameters must be a valid JSON schema), and the model's call format read from its
chat template (ToolUse: what the prompt and the reply's parser need).

tool_choice "none" leaves the tools out of the prompt and the reply unparsed (the model is not
told of them, so it cannot call them). "auto" renders them and parses the calls the model makes.
"required" and a named function also start the reply with the call's head in the prompt (the
template's `<tool_call>\\n{"name": "`, or up to the arguments for a named function or the one
tool there is), so the model continues inside a call; serve.tool_grammar holds the rest of the
call (and under "auto" a call the model starts) to the functions' names and parameters schemas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..constrain import json_schema
from ..errors import SpecdecError
from .errors import ApiError, invalid
from .fields import flag
from .tool_calls import HERMES, LLAMA3, CallFormat

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
_FAMILIES = "Qwen2.5 / Qwen3 / Hermes <tool_call> calls, Llama 3.x JSON calls"


@dataclass(frozen=True)
class Tools:
    """The request's functions (OpenAI's tool objects, as the templates take them), what the
    model must do with them (choice "auto" or "required"; `function`: that one must be called)
    and whether it may make more than one call."""

    tools: tuple[dict, ...]
    choice: str = "auto"
    function: str | None = None
    parallel: bool = True


@dataclass(frozen=True)
class ToolUse:
    """Tools as this model takes them: its call format, the ids of its open and close tags
    where each is one token of its tokenizer (the grammar writes them as those tokens), and the
    call's head the prompt ends with when a call is required ("" under "auto")."""

    tools: Tools
    form: CallFormat
    open_id: int | None = None
    close_id: int | None = None

    @property
    def head(self) -> str:
        if self.tools.choice == "auto":
            return ""
        return self.form.head(self.tools.function)

    @property
    def stops(self) -> tuple[str, ...]:
        """Where decoding may end early: after the one call allowed (parallel_tool_calls false)."""
        return (self.form.close,) if self.form.close and not self.tools.parallel else ()


def read_tools(body: dict) -> Tools | None:
    """The request's tools, or None where it has none or tool_choice is "none"."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = flag(body, "parallel_tool_calls", True)
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice asks for a tool call but the request has no tools: send tools, or leave "
                          "tool_choice out", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    if len(tools) > MAX_TOOLS:
        raise invalid(f"at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    names = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise invalid(f"two tools are named {twice!r}: each function needs a name of its own", "tools")
    if choice is None or choice == "auto":
        return Tools(tuple(tools), "auto", None, parallel)
    if choice == "none":
        return None
    if choice == "required":  # with one tool, a call of it
        return Tools(tuple(tools), "required", names[0] if len(names) == 1 else None, parallel)
    name = _named(choice)
    if name not in names:
        raise invalid(f"tool_choice names the function {name!r}, which is not among the tools ({', '.join(names)})",
                      "tool_choice")
    return Tools(tuple(tools), "required", name, parallel)


def call_format(template: str | dict | None) -> CallFormat:
    """The call format a chat template writes, or a 400 where it takes no tools or writes
    calls in a format this server does not read."""
    if isinstance(template, dict):  # named templates: the tool-use one where there is one
        template = template.get("tool_use") or template.get("default")
    if not template:
        raise ApiError(400, "this model has no chat template, so it cannot be told of tools: leave tools out",
                       "tools", "tools_unsupported")
    if "tools" not in template:
        raise ApiError(400, "this model's chat template does not take tools: leave tools out, or serve a model "
                            f"whose template does ({_FAMILIES})", "tools", "tools_unsupported")
    if HERMES.open in template:
        return HERMES
    if "<|start_header_id|>" in template and '"parameters"' in template:
        return LLAMA3
    raise ApiError(400, "this model's chat template takes tools but writes calls in a format this server does "
                        f"not read (it reads {_FAMILIES}): leave tools out", "tools", "tools_unsupported")


def _function(tool: object, where: str) -> str:
    """A tool object's function name, the object checked."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": "
                      "...}} (only function tools are supported)", where)
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}",
                      f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.function.description must be a string", f"{where}.function.description")
    flag(function, "strict", False, f"{where}.function.strict")
    _schema(function.get("parameters"), f"{where}.function.parameters")
    return name


def _schema(schema: object, where: str) -> None:
    """A 400 naming the problem where `schema` is not a JSON schema the grammar library can hold
    arguments to (the calls are constrained to it)."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise invalid(f"{where} must be a JSON schema object, such as {{\"type\": \"object\", \"properties\": "
                      "{...}}", where, "invalid_schema")
    try:
        json_schema(schema, where)
    except SpecdecError as e:
        raise invalid(str(e), where, "invalid_schema") from None


def _named(choice: object) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise invalid("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}", "tool_choice")
    return name
