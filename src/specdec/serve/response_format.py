"""A request's structured-output fields -> the grammar its output must match (specdec.constrain):
OpenAI's response_format ({"type": "text"}: none; {"type": "json_object"}; {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}) and llama-server's `grammar` (GBNF, or llguidance's
Lark) and top-level `json_schema`. At most one of them; an invalid schema or grammar is a 400
that names the problem. The worker turns the grammar into the generation's rule (grammar_rules)."""

from __future__ import annotations

from ..constrain import Grammar, gbnf, grammar_rule, json_object, json_schema
from ..errors import SpecdecError
from .errors import invalid

_FIELDS = ("response_format", "grammar", "json_schema")


def read_grammar(body: dict) -> Grammar | None:
    """The grammar the request's output must match, or None."""
    given = [name for name in _FIELDS if body.get(name) is not None and body.get(name) != {"type": "text"}]
    if len(given) > 1:
        raise invalid(f"send one of {', '.join(given)}: each says what the output must match", given[1],
                      "conflicting_parameters")
    if not given:
        return None
    name = given[0]
    try:
        if name == "grammar":
            return gbnf(body[name], "grammar")
        if name == "json_schema":
            return json_schema(body[name], "json_schema")
        return _response_format(body[name])
    except SpecdecError as e:
        raise invalid(str(e), name, "invalid_grammar" if name == "grammar" else "invalid_schema") from None


def _response_format(value: object) -> Grammar:
    kinds = "\"text\", \"json_object\" or \"json_schema\""
    if not isinstance(value, dict):
        raise SpecdecError(f"response_format must be an object such as {{\"type\": \"json_object\"}} (type {kinds})")
    kind = value.get("type")
    if kind == "json_object":
        return json_object()
    if kind != "json_schema":
        raise SpecdecError(f"response_format.type must be {kinds}, got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise SpecdecError("response_format.json_schema must be an object with the schema under \"schema\" "
                           "(and a \"name\"), as {\"name\": \"reply\", \"schema\": {\"type\": \"object\"}}")
    name = spec.get("name")
    return json_schema(spec["schema"], f"response_format.json_schema{f' {name!r}' if isinstance(name, str) else ''}")


def grammar_rules(grammar: Grammar | None, tokenizer, lm, prompt_length: int) -> tuple:
    """The generation's grammar rule (none without a grammar): masks over `lm`'s logits columns,
    complete at the model's end ids (also under ignore_eos, which then decodes end ids to the limit)."""
    if grammar is None:
        return ()
    return (grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, prompt_length),)
