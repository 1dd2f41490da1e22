"""Structured output on the real default pair (marked real): greedy speculation under a JSON
schema equals constrained plain decoding for every proposer, each output validates; and the
official openai client's chat.completions.parse with a Pydantic model against `specdec serve` on
the pair returns the model, its text the same as constrained plain decoding in process."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel
from serve_native import launch, stop

from specdec import generate
from specdec.constrain import grammar_rule, json_schema

pytestmark = pytest.mark.real

TEXT = ("Extract the person as JSON.\n\nMaria Gonzalez, 34, is a data engineer at Northwind Analytics in Madrid. "
        "She builds streaming pipelines in Scala and Python and knows Kafka and Spark well.")
TOKENS = 160


class Person(BaseModel):
    name: str
    age: int
    city: str
    skills: list[str]


SCHEMA = Person.model_json_schema() | {"additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    running = launch(["--max-sequences", "2"])
    yield running
    stop(running)
    running.worker.loaded = None  # the pair's memory goes with the module


def constrained_plain(lm, tokenizer, ids: list[int]) -> list[int]:
    rule = grammar_rule(json_schema(SCHEMA), tokenizer, lm.vocab_size, lm.eos_token_ids, len(ids))
    return generate(lm, ids, max_new_tokens=TOKENS, rules=(rule,)).new_tokens


def test_the_openai_clients_parse_on_the_real_pair(server):
    from specdec.prompts.chat import encode_messages

    messages = [{"role": "user", "content": TEXT}]
    completion = server.client(timeout=600).chat.completions.parse(
        model=server.name, messages=messages, response_format=Person, max_tokens=TOKENS, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
    assert "Maria" in choice.message.parsed.name and choice.message.parsed.age == 34
    loaded = server.worker.loaded  # the server is idle: its target decodes in process
    ids = encode_messages(loaded.tokenizer, messages, None, "")
    reference = constrained_plain(loaded.lm, loaded.tokenizer, ids)
    assert choice.message.content == loaded.tokenizer.decode(reference, skip_special_tokens=True)


@pytest.mark.parametrize("method", ["served", "lookup", "suffix"])
def test_greedy_speculation_under_a_schema_equals_constrained_plain_decoding(server, method):
    """The server's own proposer (the pair's default method) and the model-free ones, in process."""
    from specdec import PromptLookup
    from specdec.prompts.chat import encode_prompt
    from specdec.proposers import SuffixProposer

    loaded = server.worker.loaded
    drafter = {"served": loaded.drafter, "lookup": PromptLookup(3), "suffix": SuffixProposer(4)}[method]
    ids = encode_prompt(loaded.tokenizer, TEXT)
    rule = grammar_rule(json_schema(SCHEMA), loaded.tokenizer, loaded.lm.vocab_size, loaded.lm.eos_token_ids,
                        len(ids))
    out = generate(loaded.lm, ids, drafter=drafter, max_new_tokens=TOKENS, rules=(rule,))
    assert out.new_tokens == constrained_plain(loaded.lm, loaded.tokenizer, ids) and out.finish_reason == "eos"
    jsonschema.validate(json.loads(loaded.tokenizer.decode(out.new_tokens, skip_special_tokens=True)), SCHEMA)
    if method == "served":
        assert 0 < out.stats.accepted <= out.stats.proposed
