"""Tools in a chat request (serve.tools, serve.messages, serve.tool_calls, serve.tool_reply,
prompts.chat): the fields checked, the chat templates of the supported families given the tools
and a conversation's calls and results, and the model's reply parsed into content and calls.

What must hold:
- each format's calls are read from the reply (Qwen2.5/Qwen3's `<tool_call>` JSON, Llama 3.x's
  JSON), arguments as the model wrote them, the text before the first call as content;
- a reply read in any split (the stream) gives the same content and calls as read at once, and
  its stream deltas reassemble (the openai client's own accumulator) to the whole message;
- a reply with no call comes back as its text exactly;
- a bad tool (no name, a schema that is not one, a name twice) or tool_choice is a 400 naming it;
  a template without tools, or with a format not read here, a 400 naming tools;
- the templates render the tools, an assistant's calls and the tool's result into the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_files import T, write_model
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.serve.errors import ApiError
from specdec.serve.messages import read_messages
from specdec.serve.tool_calls import HERMES, LLAMA3, CallParser, parse_reply
from specdec.serve.tool_reply import ToolReply
from specdec.serve.tools import MAX_TOOLS, ToolUse, call_format, read_tools

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN = (TEMPLATES / "qwen2.5.jinja").read_text()  # Qwen2.5-Coder-1.5B-Instruct's, from its GGUF
LLAMA = (TEMPLATES / "llama3.2.jinja").read_text()  # Llama-3.2-3B-Instruct's (as llama.cpp keeps it)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ARGS = '{"city": "Paris \\"}{\\" ", "days": [1, {"a": "]"}], "x": null}'

HERMES_REPLIES = [  # (reply, content, [(name, arguments)])
    (f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>', None, [("get_weather", ARGS)]),
    ('Let me look.\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n'
     '{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>\n', "Let me look.",
     [("get_time", "{}"), ("get_weather", '{"city":"Oslo"}')]),
    ('<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}\n</tool_call>', None,  # keys swapped
     [("get_weather", '{"city": "Rome"}')]),
    ('The answer is 4.', "The answer is 4.", []),
    ('a <tool_call>not json</tool_call> b', "a <tool_call>not json</tool_call> b", []),
    ('x <tool_ca', "x <tool_ca", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', None, [("get_weather", '{"city": "Pa')]),
    # bare calls (no tag) at the reply's start, as Qwen2.5 writes them after a first call
    ('{"name": "get_time", "arguments": {"city": "Tokyo"}}', None, [("get_time", '{"city": "Tokyo"}')]),
    ('\n{{"name": "get_time", "arguments": {"city": "Tokyo"}}}\n', None, [("get_time", '{"city": "Tokyo"}')]),
    ('{"name": "get_time", "arguments": {}}\n{"name": "get_weather", "arguments": {"city": "Oslo"}}', None,
     [("get_time", "{}"), ("get_weather", '{"city": "Oslo"}')]),
    ('{"a": 1} <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', '{"a": 1}', [("get_time", "{}")]),
    ('It is {"name": "get_time", "arguments": {}}', 'It is {"name": "get_time", "arguments": {}}', []),
]
LLAMA_REPLIES = [
    (f'{{"name": "get_weather", "parameters": {ARGS}}}', None, [("get_weather", ARGS)]),
    ('  {"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("get_time", "{}"), ("get_weather", '{"city": "Oslo"}')]),
    ('It is {"name": "get_time", "parameters": {}}', 'It is {"name": "get_time", "parameters": {}}', []),
    (' {"nam": 1}', ' {"nam": 1}', []),
]


def _calls(calls) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("form,reply,content,calls", [(HERMES, *r) for r in HERMES_REPLIES] +
                         [(LLAMA3, *r) for r in LLAMA_REPLIES])
def test_calls_are_read_from_each_format(form, reply, content, calls):
    got_content, got = parse_reply(form, reply)
    assert (got_content, _calls(got)) == (content, calls)
    assert all(c.id.startswith("call_") and len(c.id) > 20 for c in got) and len({c.id for c in got}) == len(got)


@pytest.mark.parametrize("form,reply", [(HERMES, r[0]) for r in HERMES_REPLIES] + [(LLAMA3, r[0]) for r in LLAMA_REPLIES])
@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 200), max_size=12))
def test_a_reply_read_in_pieces_equals_it_read_whole(form, reply, cuts):
    parser, pieces, at = CallParser(form), [], 0
    for cut in sorted(c % (len(reply) + 1) for c in cuts) + [len(reply)]:
        pieces += parser.feed(reply[at:cut])
        at = cut
    pieces += parser.finish()
    content, calls = parse_reply(form, reply)
    assert "".join(p.content for p in pieces) == (content or "")
    assert _calls(parser.calls) == _calls(calls)
    streamed = {}
    for p in pieces:
        if p.start is not None:
            streamed[p.start.index] = p.start.name, ""
        elif p.index is not None:
            name, arguments = streamed[p.index]
            streamed[p.index] = name, arguments + p.arguments
    assert [streamed[i] for i in sorted(streamed)] == _calls(calls)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<tool", "_call>", "{", "}", '"name"', ":", " ",
                                 "\n", '"x"', ",", '"arguments"', "text", "\\", '"']), max_size=30),
       st.sampled_from([HERMES, LLAMA3]))
def test_a_reply_without_calls_is_its_text_exactly(parts, form):
    text = "".join(parts)
    content, calls = parse_reply(form, text)
    if not calls:
        assert content == text


@pytest.mark.parametrize("split", [False, True])
def test_a_bare_hermes_call_is_read_only_where_its_name_is_a_tool(split):
    names = frozenset({"get_time", "get_weather"})
    for reply, calls in [('{"name": "Bob", "arguments": {"age": 3}}', []),
                         ('{{"name": "Bob", "arguments": {}}}', []),
                         ('{{"name": "get_time", "arguments": {"city": "Tokyo"}}}', [("get_time", '{"city": "Tokyo"}')])]:
        parser = CallParser(HERMES, names=names)
        pieces = [p for c in (reply if split else [reply]) for p in parser.feed(c)] + parser.finish()
        assert _calls(parser.calls) == calls
        assert "".join(p.content for p in pieces) == ("" if calls else reply)
    use = ToolUse(read_tools({"tools": [WEATHER, CLOCK]}), HERMES)  # the server's parser takes the request's names
    assert ToolReply(use).message('{"name": "Bob", "arguments": {}}') == {"content": '{"name": "Bob", "arguments": {}}'}
    message = ToolReply(use).message('{{"name": "get_time", "arguments": {}}}')
    assert message["content"] is None and message["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_a_required_call_starts_in_the_prompt_and_parallel_false_keeps_one():
    head = HERMES.head("get_weather")
    assert head == '<tool_call>\n{"name": "get_weather", "arguments": '
    content, calls = parse_reply(HERMES, '{"city": "Oslo"}}\n</tool_call>', start=head)
    assert (content, _calls(calls)) == (None, [("get_weather", '{"city": "Oslo"}')])
    content, calls = parse_reply(HERMES, 'get_time", "arguments": {}}\n</tool_call>', start=HERMES.head(None))
    assert _calls(calls) == [("get_time", "{}")]
    two = HERMES_REPLIES[1][0]
    assert _calls(parse_reply(HERMES, two, parallel=False)[1]) == [("get_time", "{}")]
    assert _calls(parse_reply(LLAMA3, LLAMA_REPLIES[1][0], parallel=False)[1]) == [("get_time", "{}")]
    assert ToolUse(read_tools({"tools": [WEATHER], "parallel_tool_calls": False}), HERMES).stops == ("</tool_call>",)
    assert ToolUse(read_tools({"tools": [WEATHER]}), HERMES).stops == ()


def test_stream_deltas_reassemble_to_the_whole_message():
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    use = ToolUse(read_tools({"tools": [WEATHER, CLOCK]}), HERMES)
    reply = HERMES_REPLIES[1][0]
    whole = ToolReply(use).message(reply)
    stream, state = ToolReply(use), ChatCompletionStreamState()
    deltas = [d for i in range(0, len(reply), 5) for d in stream.deltas(reply[i:i + 5])] + stream.last_deltas()
    assert any("id" in d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert sum(1 for d in deltas if "tool_calls" in d and "id" not in d["tool_calls"][0]) >= 2  # fragments
    for n, delta in enumerate([{"role": "assistant", **deltas[0]}, *deltas[1:]]):
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        list(state.handle_chunk(ChatCompletionChunk.model_validate(chunk)))
    got = state.current_completion_snapshot.choices[0].message
    assert got.content == whole["content"] == "Let me look."
    assert [(c.function.name, c.function.arguments) for c in got.tool_calls] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]]


# --- the request's fields -------------------------------------------------------------------


@pytest.mark.parametrize("fields,param", [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}, "tools[0].function.description"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"minimum": "x"}}}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_a_bad_tool_field_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as error:
        read_tools(fields)
    assert error.value.status == 400 and error.value.param == param, error.value.message


def test_the_choices():
    assert read_tools({}) is None and read_tools({"tools": [WEATHER], "tool_choice": "none"}) is None
    auto = read_tools({"tools": [WEATHER, CLOCK]})
    assert (auto.choice, auto.function, auto.parallel) == ("auto", None, True)
    assert ToolUse(auto, HERMES).head == ""
    required = read_tools({"tools": [WEATHER, CLOCK], "tool_choice": "required", "parallel_tool_calls": False})
    assert (required.choice, required.function, required.parallel) == ("required", None, False)
    assert ToolUse(required, LLAMA3).head == '{"name": "'
    named = read_tools({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert ToolUse(named, LLAMA3).head == '{"name": "get_time", "parameters": '
    assert read_tools({"tools": [CLOCK], "tool_choice": "required"}).function == "get_time"  # the one there is


def test_the_call_format_of_a_template():
    assert call_format(QWEN) is HERMES and call_format(LLAMA) is LLAMA3
    assert call_format({"default": "{{ messages }}", "tool_use": QWEN}) is HERMES
    for template, says in [(None, "no chat template"), ("{% for m in messages %}{{ m.content }}{% endfor %}",
                                                         "does not take tools"),
                           ("{{ tools }} [TOOL_CALLS]", "format this server does not read")]:
        with pytest.raises(ApiError, match=says) as error:
            call_format(template)
        assert error.value.status == 400 and error.value.param == "tools"


def test_messages_with_calls_and_results():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    got = read_messages({"messages": [{"role": "user", "content": "Weather in Oslo?"},
                                      {"role": "assistant", "content": None, "tool_calls": calls},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"}]})
    assert got[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    assert got[2] == {"role": "tool", "content": "-3 C, snow", "tool_call_id": "call_1"}
    bad = [{**calls[0], "function": {"name": "get_weather", "arguments": "{city: Oslo"}}]
    with pytest.raises(ApiError) as error:
        read_messages({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": bad}]})
    assert error.value.param == "messages[1].tool_calls[0].function.arguments"


# --- the templates --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny GGUF's tokenizer (SmolLM2's, cut), its template swapped per test."""
    from specdec.gguf import store

    folder = tmp_path_factory.mktemp("tools-tokenizer")
    write_model(folder / "m.gguf", "qwen2", T.Q8_0, layers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "cache_root", lambda: folder / "cache")
        return store.tokenizer_of(str(folder / "m.gguf"))


@pytest.mark.parametrize("template,call,result", [
    (QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
     "<tool_response>\n-3 C, snow\n</tool_response><|im_end|>"),
    (LLAMA, '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>',
     '<|start_header_id|>ipython<|end_header_id|>\n\n"-3 C, snow"<|eot_id|>'),
])
def test_tools_calls_and_results_are_rendered_through_the_template(tokenizer, template, call, result):
    from specdec.prompts.chat import encode_messages

    tokenizer.chat_template = template
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    messages = read_messages({"messages": [{"role": "user", "content": "Weather in Oslo?"},
                                           {"role": "assistant", "content": None, "tool_calls": calls},
                                           {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"}]})
    text = tokenizer.decode(encode_messages(tokenizer, messages, [WEATHER]))
    assert '"name": "get_weather"' in text and "The weather in a city" in text  # the tool, as the template writes it
    assert call in text and result in text
    head = HERMES.head("get_weather") if template is QWEN else LLAMA3.head("get_weather")
    plain = encode_messages(tokenizer, messages[:1], [WEATHER])
    assert tokenizer.decode(encode_messages(tokenizer, messages[:1], [WEATHER], head)) == tokenizer.decode(plain) + head
    assert "get_weather" not in tokenizer.decode(encode_messages(tokenizer, messages[:1]))  # no tools: not told
