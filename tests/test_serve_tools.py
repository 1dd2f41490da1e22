"""Tools through `specdec serve` with the official openai client, on the tiny GGUF pair
(tests/serve_native.py) written with Qwen2.5's chat template (tests/data/templates) and its
`<tool_call>` / `</tool_call>` tokens added to the token list, greedy with draft:k=3.

What must hold:
- the prompt is the template given the tools (none under tool_choice "none"), and a required
  call's head after it;
- the reply is the target's own greedy decoding under the tool calls' grammar (plain decoding
  in this process with the same rule): a named or required call comes back in
  message.tool_calls with arguments valid under the function's schema, finish_reason
  "tool_calls"; a call the model starts itself under "auto" (its tag forced here by logit_bias)
  too; streamed as delta.tool_calls that the client's accumulator reassembles to the same message;
- a conversation with an assistant's calls and the tool's result is taken, the result in the prompt;
- bad tools are a 400 naming the field; a model whose template takes no tools (SmolLM2's) a 400
  naming tools.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from gguf_files import tokenizer_fields
from serve_native import start_native, stop, target_alone
from test_tools import QWEN, WEATHER

from specdec.serve.tool_calls import HERMES, parse_reply
from specdec.serve.tool_grammar import tool_grammar
from specdec.serve.tools import ToolUse, read_tools

TOKENS = 60
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
FORECAST = {"type": "function", "function": {"name": "get_forecast", "parameters": {  # a short call, even at random
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}, "days": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (FORECAST, CLOCK)}
# The tags as tokens of their own (as Qwen2.5's are), padded to a whole 128 rows (the native runtime's blocks).
TOKEN_LIST = [*tokenizer_fields()["tokens"], "<tool_call>", "</tool_call>", *(f"<|extra_{i}|>" for i in range(126))]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-tools")


@pytest.fixture(scope="module")
def served(folder):
    running = start_native(folder, template=QWEN, tokens=TOKEN_LIST)
    yield running
    stop(running)


@pytest.fixture(scope="module")
def alone(folder, served):
    """The target alone, in this process, and its tokenizer (the files the server wrote)."""
    return target_alone(folder)


def both(served, **request) -> tuple:
    """The request's reply whole, and streamed as the openai client's accumulator reassembles it."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    client = served.client()
    body = dict(model=served.name, max_tokens=TOKENS, temperature=0, **request)
    whole = client.chat.completions.create(**body)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **body):
        list(state.handle_chunk(chunk))
    return whole, state.current_completion_snapshot


def _shape(choice) -> tuple:
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
    return choice.message.content, calls, choice.finish_reason


def constrained(alone, request: dict, bias: dict | None = None) -> tuple[list[int], str | None, list]:
    """The prompt, and the content and calls of the target's plain greedy decoding under the
    request's tool grammar (and logit_bias), read as the server reads them."""
    from specdec import generate
    from specdec.constrain import grammar_rule
    from specdec.decode.penalties import Penalties
    from specdec.prompts.chat import encode_messages

    lm, tokenizer = alone
    added = tokenizer.get_added_vocab()
    use = ToolUse(read_tools(request), HERMES, added["<tool_call>"], added["</tool_call>"])
    prompt = encode_messages(tokenizer, ASK, list(use.tools.tools), use.head)
    rules = Penalties(logit_bias=tuple((bias or {}).items())).rules(len(prompt), lm.vocab_size)
    rules += (grammar_rule(tool_grammar(use), tokenizer, lm.vocab_size, lm.eos_token_ids, len(prompt)),)
    out = generate(lm, prompt, max_new_tokens=TOKENS, rules=rules).new_tokens
    content, calls = parse_reply(HERMES, tokenizer.decode(out, skip_special_tokens=True), use.tools.parallel, use.head)
    return prompt, content, calls


@pytest.mark.parametrize("request_", [
    {"tools": [FORECAST, CLOCK], "tool_choice": {"type": "function", "function": {"name": "get_forecast"}}},
    {"tools": [FORECAST, CLOCK], "tool_choice": "required", "parallel_tool_calls": False},
], ids=["named", "required"])
def test_a_required_call_is_the_targets_own_under_the_grammar(served, alone, request_):
    whole, streamed = both(served, messages=ASK, **request_)
    prompt, content, calls = constrained(alone, request_)
    assert whole.usage.prompt_tokens == len(prompt)
    got = _shape(whole.choices[0])
    assert got == (content, [(c.name, c.arguments) for c in calls], "tool_calls") and len(calls) == 1
    name, arguments = got[1][0]
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    assert "function" not in request_["tool_choice"] or name == "get_forecast"
    assert whole.choices[0].message.tool_calls[0].id.startswith("call_")
    assert _shape(streamed.choices[0]) == got


def test_a_call_the_model_starts_is_held_to_the_schema(served, alone):
    """Under "auto" the grammar starts at the model's own `<tool_call>` token (logit_bias makes
    the random model write it); parallel_tool_calls false ends the reply after the call."""
    request = {"tools": [FORECAST, CLOCK], "parallel_tool_calls": False}
    tag = alone[1].get_added_vocab()["<tool_call>"]
    whole, streamed = both(served, messages=ASK, logit_bias={str(tag): 100}, **request)
    _, content, calls = constrained(alone, request, {tag: 100.0})
    got = _shape(whole.choices[0])
    assert got == (content, [(c.name, c.arguments) for c in calls], "tool_calls") and len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    assert _shape(streamed.choices[0]) == got


def test_auto_and_none(served, alone):
    from specdec.prompts.chat import encode_messages

    request = {"tools": [FORECAST, CLOCK]}
    whole, streamed = both(served, messages=ASK, **request)
    prompt, content, calls = constrained(alone, request)
    assert whole.usage.prompt_tokens == len(prompt)
    assert _shape(whole.choices[0])[:2] == _shape(streamed.choices[0])[:2] == (content, [(c.name, c.arguments)
                                                                                         for c in calls])
    none, _ = both(served, messages=ASK, tool_choice="none", **request)
    assert none.usage.prompt_tokens == len(encode_messages(alone[1], ASK))  # the model is not told of them


def test_a_tool_result_turn(served, alone):
    from specdec.prompts.chat import encode_messages
    from specdec.serve.messages import read_messages

    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_forecast", "arguments": '{"city": "Oslo", "days": 2}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "-3 C and snowing"}]
    reply = served.client().chat.completions.create(model=served.name, messages=messages, tools=[FORECAST],
                                                    max_tokens=4, temperature=0)
    prompt = encode_messages(alone[1], read_messages({"messages": messages}), [FORECAST])
    assert reply.usage.prompt_tokens == len(prompt)
    text = alone[1].decode(prompt)
    assert "<tool_response>\n-3 C and snowing\n</tool_response>" in text
    assert '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>' in text


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "{oops"}}]}], "tools": [WEATHER]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_are_a_400_naming_the_field(served, fields, param):
    body = {"model": served.name, "messages": ASK, "max_tokens": 2, **fields}
    reply = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_a_template_without_tools_is_a_400(tmp_path_factory):
    running = start_native(tmp_path_factory)  # SmolLM2's template: no tools
    try:
        with pytest.raises(openai.BadRequestError) as error:
            running.client().chat.completions.create(model=running.name, messages=ASK, tools=[WEATHER], max_tokens=2)
        assert error.value.body["param"] == "tools" and "does not take tools" in error.value.body["message"]
        ok = running.client().chat.completions.create(model=running.name, messages=ASK, tools=[WEATHER],
                                                      tool_choice="none", max_tokens=2)
        assert ok.choices[0].message.tool_calls is None
    finally:
        stop(running)
