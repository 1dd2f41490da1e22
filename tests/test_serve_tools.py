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
- tools with a JSON response format under "auto": one grammar of calls, a bare call or the
  answer, each branch (steered by logit_bias) the target's own greedy decoding under it; the
  client's parse with a strict tool and a Pydantic output model gets calls or a parsed answer;
- a conversation with an assistant's calls and the tool's result is taken, the result in the prompt;
- bad tools are a 400 naming the field; a model whose template takes no tools (SmolLM2's) a 400
  naming tools.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from gguf_files import tokenizer_fields
from pydantic import BaseModel, Field
from serve_native import start_native, stop, target_alone
from test_tools import QWEN, WEATHER

from specdec.constrain import json_schema
from specdec.serve.tool_calls import HERMES, LLAMA3, parse_reply
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
ANSWER = {"type": "object", "properties": {"sky": {"enum": ["sunny", "snow"]}, "degrees": {
    "type": "integer", "minimum": -50, "maximum": 50}}, "required": ["sky", "degrees"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": ANSWER, "strict": True}}
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
    body = {"model": served.name, "max_tokens": TOKENS, "temperature": 0, **request}
    whole = client.chat.completions.create(**body)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **body):
        list(state.handle_chunk(chunk))
    return whole, state.current_completion_snapshot


def _shape(choice) -> tuple:
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
    return choice.message.content, calls, choice.finish_reason


def constrained(alone, request: dict, bias: dict | None = None, answer=None,
                tokens: int = TOKENS) -> tuple[list[int], str | None, list]:
    """The prompt, and the content and calls of the target's plain greedy decoding under the
    request's tool grammar (with the response format's grammar `answer`, and logit_bias), read
    as the server reads them."""
    from specdec import generate
    from specdec.constrain import grammar_rule
    from specdec.decode.penalties import Penalties
    from specdec.prompts.chat import encode_messages

    lm, tokenizer = alone
    added = tokenizer.get_added_vocab()
    use = ToolUse(read_tools(request), HERMES, added["<tool_call>"], added["</tool_call>"])
    prompt = encode_messages(tokenizer, ASK, list(use.tools.tools), use.head)
    rules = Penalties(logit_bias=tuple((bias or {}).items())).rules(len(prompt), lm.vocab_size)
    rules += (grammar_rule(tool_grammar(use, answer), tokenizer, lm.vocab_size, lm.eos_token_ids, len(prompt)),)
    out = generate(lm, prompt, max_new_tokens=tokens, rules=rules).new_tokens
    content, calls = parse_reply(HERMES, tokenizer.decode(out, skip_special_tokens=True), use.tools.parallel, use.head)
    return prompt, content, calls


@pytest.mark.parametrize("request_", [
    {"tools": [FORECAST, CLOCK], "tool_choice": {"type": "function", "function": {"name": "get_forecast"}}},
    {"tools": [FORECAST, CLOCK], "tool_choice": "required", "parallel_tool_calls": False},
    {"tools": [FORECAST, CLOCK], "tool_choice": "required", "response_format": FORMAT},  # for a later turn's answer
], ids=["named", "required", "required-with-format"])
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




class Weather(BaseModel):  # ANSWER as the openai client's parse takes it
    sky: Literal["sunny", "snow"]
    degrees: int = Field(ge=-50, le=50)


class Forecast(BaseModel):  # FORECAST's parameters
    city: Literal["Oslo", "Paris"]
    days: int = Field(ge=1, le=7)


def steer(tokenizer, branch: str) -> dict[int, float]:
    """logit_bias that sends the random model down one branch of the grammar of calls, a bare
    call or the answer: the `<tool_call>` token up ("call") or away, and for "answer" also the
    tokens that spell the start of the answer's first key (`sky`, `"sky`) up, past `{"name"`."""
    tag = tokenizer.get_added_vocab()["<tool_call>"]
    bias = {tag: 100.0 if branch == "call" else -100.0}
    if branch == "answer":
        starts = {w[:i] for w in ("sky", '"sky') for i in range(1, len(w) + 1)} - {'"'}
        bias |= {t: 100.0 for t in range(len(tokenizer)) if tokenizer.decode([t]) in starts}
    return bias


@pytest.mark.parametrize("branch", ["call", "bare", "answer"])
def test_tools_with_a_response_format_reply_with_calls_or_the_answer(served, alone, branch):
    """tool_choice "auto" with a JSON schema (as the Agents SDK sends for an agent with an output
    type): one grammar of tagged calls, a bare call or the answer, each branch reached by
    logit_bias (steer). Each reply is the target's own greedy decoding under that grammar, whole
    and streamed alike, and valid under its schema."""
    request = {"tools": [FORECAST, CLOCK], "parallel_tool_calls": False}  # tag up: one call, not calls to the limit
    bias = steer(alone[1], branch)
    whole, streamed = both(served, messages=ASK, logit_bias={str(t): b for t, b in bias.items()},
                           response_format=FORMAT, max_tokens=200, **request)  # room for bounded whitespace
    _, content, calls = constrained(alone, request, bias, json_schema(ANSWER), 200)
    got = _shape(whole.choices[0])
    assert got[:2] == (content, [(c.name, c.arguments) for c in calls]) and _shape(streamed.choices[0]) == got
    assert got[2] == ("stop" if branch == "answer" else "tool_calls"), got
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    if branch == "answer":
        jsonschema.validate(json.loads(content), ANSWER)
    else:
        assert len(calls) == 1 and content is None, got  # bare: the tag is biased away, so no call has it


@pytest.mark.parametrize("form", [HERMES, LLAMA3], ids=["hermes", "llama3"])
def test_the_grammar_of_calls_or_the_answer(alone, form):
    """What the grammar of tools with a response format takes whole, in each call format: the
    answer, a bare call (spaced as templates write calls), tagged calls (HERMES; parallel only
    where allowed); not free text, an unknown function, arguments or an answer off their schemas."""
    import llguidance

    from specdec.constrain.vocab import vocab_of

    lm, tokenizer = alone
    added = tokenizer.get_added_vocab()
    vocab = vocab_of(tokenizer, lm.vocab_size, lm.eos_token_ids)
    key = form.arguments_key
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    forecast = f'{{"name": "get_forecast", "{key}": {{"city": "Oslo", "days": 2}}}}'
    texts = {'{"sky": "snow", "degrees": -3}': True, forecast: True, call: form is HERMES,
             f"{call}\n{call}": form is HERMES, "It is snowing.": False, forecast.replace("Oslo", "Rome"): False,
             forecast.replace("get_forecast", "get_news"): False, '{"sky": "rain", "degrees": 3}': False}
    for parallel in (True, False):
        tags = (added["<tool_call>"], added["</tool_call>"]) if form is HERMES else (None, None)
        use = ToolUse(read_tools({"tools": [FORECAST, CLOCK], "parallel_tool_calls": parallel}), form, *tags)
        grammar = tool_grammar(use, json_schema(ANSWER))
        for text, ok in texts.items():
            matcher = llguidance.LLMatcher(vocab, grammar.text)
            ids = tokenizer.encode(text, add_special_tokens=False)
            whole = matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
            assert whole == (ok and (parallel or text.count("<tool_call>") < 2)), (text, parallel)


def test_the_clients_parse_with_tools_and_an_output_model(served, alone):
    """The openai client's parse with a strict function tool and a Pydantic response format,
    sampled with seeds 0..11, half of them steered to the answer: every reply is a call whose
    arguments parse into the tool's model or an answer that parses into the response format's,
    and both occur (the seeds are fixed, so this repeats exactly)."""
    client, kinds = served.client(), set()
    tool = openai.pydantic_function_tool(Forecast, name="get_forecast")
    answer = {str(t): b for t, b in steer(alone[1], "answer").items()}
    for seed in range(12):
        reply = client.chat.completions.parse(model=served.name, messages=ASK, tools=[tool], response_format=Weather,
                                              parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=200,
                                              logit_bias=answer if seed % 2 else None)
        choice = reply.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert all(isinstance(c.function.parsed_arguments, Forecast) for c in choice.message.tool_calls)
            kinds.add("call")
        else:
            assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Weather), choice
            kinds.add("answer")
    assert kinds == {"call", "answer"}


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
    ({"tools": [WEATHER], "grammar": 'root ::= "yes"'}, "tools"),  # only a JSON answer can stand beside calls
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
