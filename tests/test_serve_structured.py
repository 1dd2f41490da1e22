"""Structured output through `specdec serve` (serve.response_format) on the tiny native GGUF pair
(tests/serve_native.py: random weights, draft:k=3, greedy): the official openai client's
chat.completions.parse with a Pydantic model gets a parsed reply; a JSON schema's and a GBNF
grammar's greedy text equal constrained plain decoding of the target in this process; an invalid
schema or grammar, or two of the fields at once, is a 400 that names the problem."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from serve_native import start_native, stop, target_alone

from specdec import generate
from specdec.constrain import gbnf, grammar_rule, json_schema


class Reply(BaseModel):
    colour: Literal["red", "green", "blue"]
    ok: bool
    count: int = Field(ge=0, le=99)


SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "maximum": 9,
          "minimum": 0}}, "required": ["answer", "n"], "additionalProperties": False}
GBNF = 'root ::= "The answer is " ("yes" | "no") "."'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-structured")
    running = start_native(folder)
    yield running, folder
    stop(running)


def test_the_openai_clients_parse_returns_the_pydantic_model(server):
    running, _ = server
    completion = running.client().chat.completions.parse(
        model=running.name, messages=[{"role": "user", "content": "Pick a colour."}], response_format=Reply,
        max_tokens=200)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Reply)
    assert Reply.model_validate_json(choice.message.content) == choice.message.parsed


@pytest.mark.parametrize("field", ["schema", "grammar"])
def test_greedy_text_equals_constrained_plain_decoding(server, field):
    running, folder = server
    body = {"model": running.name, "prompt": "Answer: ", "max_tokens": 120, "temperature": 0}
    if field == "schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    else:
        body["grammar"] = GBNF
    reply = httpx.post(f"{running.url}/v1/completions", json=body, timeout=120).json()
    text = reply["choices"][0]["text"]
    lm, tokenizer = target_alone(folder)
    prompt = tokenizer.encode("Answer: ", add_special_tokens=False)
    grammar = json_schema(SCHEMA) if field == "schema" else gbnf(GBNF)
    rule = grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, len(prompt))
    plain = generate(lm, prompt, max_new_tokens=120, rules=(rule,))
    assert text == tokenizer.decode(plain.new_tokens, skip_special_tokens=True)
    assert reply["choices"][0]["finish_reason"] == "stop"
    if field == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert re.fullmatch(r"The answer is (yes|no)\.", text)


@pytest.mark.parametrize("extra,param,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "Invalid type: objekt"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "with the schema under \"schema\""),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format.type must be"),
    ({"grammar": 'root ::= "a" | missing'}, "grammar", "Rule 'missing' not found"),
    ({"json_schema": {"type": "string", "pattern": "(["}}, "json_schema", "regex parse error"),
    ({"grammar": GBNF, "response_format": {"type": "json_object"}}, "grammar", "send one of response_format, grammar"),
])
def test_a_bad_schema_or_grammar_is_a_400_naming_it(server, extra, param, message):
    running, _ = server
    with pytest.raises(openai.BadRequestError) as caught:
        running.client().chat.completions.create(model=running.name, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, extra_body=extra)
    error = caught.value.body
    assert error["param"] == param and message in error["message"], error


def test_json_object_and_text_formats(server):
    """json_object: the reply starts an object (its whole text is checked by the schema tests); type
    text: the same reply as no response_format."""
    running, _ = server
    client = running.client()
    messages = [{"role": "user", "content": "hi"}]
    text = client.chat.completions.create(model=running.name, messages=messages, max_tokens=16,
                                          response_format={"type": "json_object"}).choices[0].message.content
    assert text.lstrip().startswith("{")
    free = client.chat.completions.create(model=running.name, messages=messages, max_tokens=16,
                                          response_format={"type": "text"}).choices[0].message.content
    assert free == client.chat.completions.create(model=running.name, messages=messages,
                                                  max_tokens=16).choices[0].message.content
