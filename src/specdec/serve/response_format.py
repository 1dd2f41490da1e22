"""A request's structured-output fields -> the grammar its output must match (specdec.constrain):
OpenAI's response_format ({"type": "text"}: none; {"type": "json_object"}; {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}), llama-server's `grammar` (GBNF, or llguidance's
Lark) and top-level `json_schema`, and vLLM's `guided_json` (a schema, or its JSON text),
`guided_regex`, `guided_choice` (a list of strings), `guided_grammar` and its newer
`structured_outputs` object (one of json, regex, choice, grammar, json_object: true). At most one
of them; an invalid schema, regex or grammar is a 400 that names the problem. vLLM's options
beside them (guided_decoding_backend, guided_whitespace_pattern, ...) are ignored: llguidance
decodes every grammar here, its JSON whitespace bounded as constrain bounds it. The worker turns
the grammar into the generation's rule (grammar_rules)."""

from __future__ import annotations

import json

from ..constrain import Grammar, choice, gbnf, grammar_rule, json_object, json_schema, regex
from ..constrain.vocab import vocab_of
from ..errors import SpecdecError
from .errors import invalid

_READERS = {  # field -> its value's grammar (the field's name in messages)
    "response_format": lambda value, name: _response_format(value),
    "grammar": gbnf, "json_schema": json_schema, "guided_grammar": gbnf,
    "guided_json": lambda value, name: json_schema(_schema_value(value, name), name),
    "guided_regex": regex, "guided_choice": choice,
    "structured_outputs": lambda value, name: _structured_outputs(value),
}
_STRUCTURED = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice", "grammar": "guided_grammar"}
_JSON = ("response_format", "json_schema", "guided_json")  # a bad value of these is an invalid_schema


def read_grammar(body: dict) -> Grammar | None:
    """The grammar the request's output must match, or None."""
    given = [name for name in _READERS if body.get(name) is not None and body.get(name) != {"type": "text"}]
    if len(given) > 1:
        raise invalid(f"send one of {', '.join(given)}: each says what the output must match", given[1],
                      "conflicting_parameters")
    if not given:
        return None
    name = given[0]
    try:
        return _READERS[name](body[name], name)
    except SpecdecError as e:
        raise invalid(str(e), name, "invalid_schema" if name in _JSON else "invalid_grammar") from None


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


def _schema_value(value: object, name: str) -> object:
    """A schema sent as an object or as its JSON text (vLLM takes both)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        raise SpecdecError(f"{name} is a string that is not JSON ({e}): send the schema as an object") from None


def _structured_outputs(value: object) -> Grammar:
    """vLLM's structured_outputs: one of json, regex, choice, grammar or json_object: true."""
    keys = "json, regex, choice, grammar or json_object"
    if not isinstance(value, dict):
        raise SpecdecError(f"structured_outputs must be an object with one of {keys}, such as {{\"choice\": "
                           "[\"yes\", \"no\"]}")
    if value.get("structural_tag") is not None:
        raise SpecdecError("structured_outputs.structural_tag is not supported: send tools (tool calls are held to "
                           f"their schemas) or one of {keys}")
    given = [k for k in (*_STRUCTURED, "json_object") if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise SpecdecError(f"structured_outputs must hold exactly one of {keys}, got {', '.join(given) or 'none'}")
    key = given[0]
    if key == "json_object":
        return json_object()
    return _READERS[_STRUCTURED[key]](value[key], f"structured_outputs.{key}")


def grammar_rules(grammar: Grammar | None, tokenizer, lm, prompt_length: int) -> tuple:
    """The generation's grammar rule (none without a grammar): masks over `lm`'s logits columns,
    complete at the model's end ids (also under ignore_eos, which then decodes end ids to the limit)."""
    if grammar is None:
        return ()
    return (grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, prompt_length),)


def prepare_grammars(tokenizer, lm) -> None:
    """Build the grammar library's vocabulary of `tokenizer` over `lm`'s logits now (at server
    start: ~1.1 s on 151,936 ids), so the first constrained request does not wait for it. A
    tokenizer the library cannot read is left to that request's 400, which says why."""
    try:
        vocab_of(tokenizer, lm.vocab_size, lm.eos_token_ids)
    except SpecdecError:
        return
