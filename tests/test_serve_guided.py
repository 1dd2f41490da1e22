"""vLLM's structured-output fields through `specdec serve` (serve.response_format) on the tiny
native GGUF pair (tests/serve_native.py: random weights, draft:k=3, greedy): guided_json (an
object or its JSON text), guided_regex, guided_choice, guided_grammar and structured_outputs, as
the openai client sends them in extra_body. Each reply's text equals the target's plain greedy
decoding in this process under the same grammar (speculation under the mask changes nothing),
and matches what was asked: validates under the schema, fullmatches the regex, is one of the
choices. Two of the fields at once, or a bad value, is a 400 naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from serve_native import start_native, stop, target_alone

from specdec import generate
from specdec.constrain import choice, gbnf, grammar_rule, json_object, json_schema, regex

PROMPT, TOKENS = "Answer: ", 120
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["colour", "n"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["yes", "no", "maybe later"]
GRAMMAR = 'root ::= "x=" [0-9] ("," [0-9])?'


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-guided")
    running = start_native(folder)
    yield running, folder
    stop(running)


@pytest.fixture(scope="module")
def alone(server):
    return target_alone(server[1])


def plain(alone, grammar) -> str:
    """The target's plain greedy text after PROMPT under `grammar`."""
    lm, tokenizer = alone
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    rule = grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, len(prompt))
    return tokenizer.decode(generate(lm, prompt, max_new_tokens=TOKENS, rules=(rule,)).new_tokens,
                            skip_special_tokens=True)


def matches(kind: str, text: str) -> bool:
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "choice":
        return text in CHOICES
    return re.fullmatch(r"x=[0-9](,[0-9])?", text) is not None


@pytest.mark.parametrize("extra,kind", [
    ({"guided_json": SCHEMA}, "json"),
    ({"guided_json": json.dumps(SCHEMA)}, "json"),
    ({"guided_regex": REGEX}, "regex"),
    ({"guided_choice": CHOICES}, "choice"),
    ({"guided_grammar": GRAMMAR}, "grammar"),
    ({"structured_outputs": {"json": SCHEMA}}, "json"),
    ({"structured_outputs": {"regex": REGEX}}, "regex"),
    ({"structured_outputs": {"choice": CHOICES}}, "choice"),
    ({"structured_outputs": {"grammar": GRAMMAR}}, "grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object"),
], ids=["guided_json", "guided_json-text", "guided_regex", "guided_choice", "guided_grammar", "structured-json",
        "structured-regex", "structured-choice", "structured-grammar", "structured-json_object"])
def test_a_guided_reply_is_constrained_plain_decoding(server, alone, extra, kind):
    running, _ = server
    reply = running.client().completions.create(model=running.name, prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                                                extra_body=extra)
    text = reply.choices[0].text
    grammar = {"json": json_schema(SCHEMA), "json_object": json_object(), "regex": regex(REGEX),
               "choice": choice(CHOICES), "grammar": gbnf(GRAMMAR)}[kind]
    assert text == plain(alone, grammar)
    if kind == "json_object":  # any object: the random model writes keys to the token limit
        assert text.startswith("{"), text
    else:
        assert reply.choices[0].finish_reason == "stop" and matches(kind, text), text


def test_chat_takes_guided_choice(server):
    running, _ = server
    reply = running.client().chat.completions.create(model=running.name, messages=[{"role": "user", "content": "ok?"}],
                                                     max_tokens=16, extra_body={"guided_choice": CHOICES})
    assert reply.choices[0].message.content in CHOICES


@pytest.mark.parametrize("extra,param,message", [
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "guided_json",
     "send one of response_format, guided_json"),
    ({"guided_regex": REGEX, "guided_choice": CHOICES}, "guided_choice", "send one of guided_regex, guided_choice"),
    ({"guided_regex": "[0-9"}, "guided_regex", "guided_regex is not usable"),
    ({"guided_regex": ""}, "guided_regex", "must be a non-empty string"),
    ({"guided_choice": []}, "guided_choice", "non-empty list of non-empty strings"),
    ({"guided_choice": "yes"}, "guided_choice", "non-empty list of non-empty strings"),
    ({"guided_json": "{not json"}, "guided_json", "is a string that is not JSON"),
    ({"guided_json": {"type": "objekt"}}, "guided_json", "Invalid type: objekt"),
    ({"guided_grammar": 'root ::= "a" | missing'}, "guided_grammar", "Rule 'missing' not found"),
    ({"structured_outputs": {"regex": REGEX, "choice": CHOICES}}, "structured_outputs", "exactly one of"),
    ({"structured_outputs": {}}, "structured_outputs", "got none"),
    ({"structured_outputs": {"choice": [1]}}, "structured_outputs", "structured_outputs.choice must be"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural_tag is not supported"),
])
def test_two_fields_or_a_bad_value_is_a_400_naming_it(server, extra, param, message):
    running, _ = server
    with pytest.raises(openai.BadRequestError) as caught:
        running.client().completions.create(model=running.name, prompt=PROMPT, max_tokens=4, extra_body=extra)
    error = caught.value.body
    assert error["param"] == param and message in error["message"], error


def test_the_grammar_vocabulary_is_built_at_start(tmp_path_factory):
    """The server builds the grammar library's vocabulary while it warms up: its first
    constrained request finds it cached (no build: ~1.1 s on the default target's vocabulary)."""
    from specdec.constrain.vocab import _cached

    before = _cached.cache_info().misses
    running = start_native(tmp_path_factory)
    try:
        built = _cached.cache_info().misses
        reply = running.client().completions.create(model=running.name, prompt=PROMPT, max_tokens=8,
                                                    extra_body={"guided_choice": CHOICES})
        assert reply.choices[0].text in CHOICES
        assert built == before + 1 and _cached.cache_info().misses == built
    finally:
        stop(running)
