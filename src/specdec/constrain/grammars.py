"""What a generation's text must match, as llguidance grammars, each checked when made (a bad
schema or grammar is a SpecdecError that names the problem, before anything decodes):

- json_object(): any JSON object (OpenAI's response_format {"type": "json_object"});
- json_schema(schema): a JSON value valid under the schema (OpenAI's json_schema; llguidance
  implements draft 2020-12 less a few keywords, and refuses a schema using one it lacks);
- gbnf(text): llama.cpp's GBNF (llama-server's `grammar` field) or llguidance's Lark dialect;
- lark(text): llguidance's Lark dialect (which can embed `%json {schema}`);
- regex(pattern): text that matches the pattern whole (vLLM's guided_regex);
- choice(options): exactly one of the strings (vLLM's guided_choice);
- triggered(tags): free text until a tag's trigger (e.g. `<tool_call>`), then the tag's fixed
  begin, a JSON value under its schema and its end: llama.cpp's lazy grammar for tool calls.

Whitespace inside JSON is bounded as llama.cpp's json-schema-to-grammar bounds it (one space, or
one or two newlines and up to 20 spaces or tabs): under an unbounded pattern a small model can
pad with newlines until its token limit and never close the object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SpecdecError

WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"  # llama.cpp's `space` rule


@dataclass(frozen=True)
class Grammar:
    """A checked grammar in llguidance's form (`text`) and what it is, for messages (`what`);
    a JSON grammar's `schema` (whitespace bounded), so a larger grammar can embed it as one of
    its alternatives (serve.tool_grammar: a tool call, or the response format's answer)."""

    text: str
    what: str
    schema: dict | None = None


@dataclass(frozen=True)
class Tag:
    """A constrained span inside free text: it starts where the model writes `trigger`, goes on
    with the rest of `begin` (which starts with the trigger), a JSON value under `schema`, then
    `end`."""

    trigger: str
    begin: str
    schema: dict
    end: str


def json_object() -> Grammar:
    return json_schema({"type": "object"}, "a JSON object")


def json_schema(schema: object, what: str = "the JSON schema") -> Grammar:
    """A JSON value valid under `schema` (a dict)."""
    import llguidance

    if not isinstance(schema, dict):
        raise SpecdecError(f"{what} must be a JSON object (a schema such as {{\"type\": \"object\"}}), "
                           f"got {type(schema).__name__}")
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_pattern": WHITESPACE})
    except ValueError as e:
        raise SpecdecError(f"{what} is not a usable JSON schema: {e}") from None
    return _checked(text, what, bounded(schema))


def bounded(schema: dict) -> dict:
    """`schema` with JSON whitespace bounded (WHITESPACE), for embedding as `%json {...}` in Lark."""
    return schema | {"x-guidance": {"whitespace_pattern": WHITESPACE}}


def gbnf(text: str, what: str = "the grammar") -> Grammar:
    """llama.cpp's GBNF (root ::= ...), or llguidance's Lark (start: ...): the library reads both."""
    import llguidance

    _nonempty(text, what)
    try:
        return _checked(llguidance.grammar_from("gbnf", text), what)
    except ValueError as e:  # a GBNF text that does not convert
        raise SpecdecError(f"{what} is not a usable GBNF grammar: {e}") from None


def lark(text: str, what: str = "the grammar") -> Grammar:
    import llguidance

    _nonempty(text, what)
    return _checked(llguidance.LLMatcher.grammar_from_lark(text), what)


def regex(pattern: object, what: str = "the regex") -> Grammar:
    """Text that matches `pattern` whole (Rust's regex syntax, as vLLM's guided_regex under
    llguidance; no lookaround or backreferences)."""
    import llguidance

    if not isinstance(pattern, str) or not pattern:
        raise SpecdecError(f"{what} must be a non-empty string, such as \"[0-9]{{3}}-[0-9]{{4}}\"")
    try:
        text = llguidance.LLMatcher.grammar_from_regex(pattern)
    except ValueError as e:
        raise SpecdecError(f"{what} is not a usable regex: {e}") from None
    return _checked(text, what)


def choice(options: object, what: str = "the choice") -> Grammar:
    """Exactly one of `options` (non-empty strings), as an alternation of literals."""
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise SpecdecError(f"{what} must be a non-empty list of non-empty strings, such as [\"yes\", \"no\"]")
    return _checked("start: " + " | ".join(json.dumps(o) for o in dict.fromkeys(options)), what)


def triggered(tags: Sequence[Tag], what: str = "the tool calls' grammar") -> Grammar:
    """Free text, in which each tag's trigger starts a constrained span (see Tag)."""
    import llguidance

    if not tags:
        raise SpecdecError(f"{what} needs at least one tag")
    try:
        struct = [llguidance.StructTag(trigger=t.trigger, begin=t.begin, end=t.end, grammar=bounded(t.schema))
                  for t in tags]
    except AssertionError:
        raise SpecdecError(f"{what}: each tag's begin must start with its trigger, and no trigger may be empty") \
            from None
    return _checked(llguidance.StructTag.to_grammar(struct), what)


def _nonempty(text: object, what: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise SpecdecError(f"{what} must be a non-empty string (GBNF such as 'root ::= \"yes\" | \"no\"')")


def _checked(text: str, what: str, schema: dict | None = None) -> Grammar:
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    if failed:
        raise SpecdecError(f"{what} is not usable: {messages[0].strip()}")
    return Grammar(text, what, schema)
