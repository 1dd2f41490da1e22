"""A real agent framework against `specdec serve` on the real default pair (marked real): the
OpenAI Agents SDK (openai-agents) runs an agent with two function tools through its chat
completions model and an AsyncOpenAI client at the server's URL (tracing off), greedy.

The first step requires a call (ModelSettings tool_choice "required": the server starts the
reply inside a `<tool_call>` and holds it to the tools' schemas); the SDK then goes back to
"auto", where Qwen2.5-Coder-1.5B writes its second call as a bare JSON object without the tag
(serve.tool_calls reads it, as llama.cpp's and vLLM's hermes parsers do), and its answer. Both
tools must be called with the user's cities (the SDK checks the arguments against the tools'
schemas before it runs them) and the final answer must state both results.

A second agent has an output_type (a Pydantic model): the SDK sends tools with a strict
json_schema response_format, and its final output must parse into the model and hold the
tool's result.
"""

from __future__ import annotations

import asyncio

import pytest
from serve_native import launch, stop

pytestmark = pytest.mark.real

# Told to call each tool once: without it the 1.5B model calls both again after their results.
INSTRUCTIONS = ("Call get_weather once and get_time once. When you have both results, do not call any tool again: "
                "reply with one sentence that states the weather and the time.")


def test_an_agent_calls_two_tools_and_answers():
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city, in degrees Celsius."""
        calls.append(("get_weather", city))
        return f"{city}: 18 C, sunny"

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        calls.append(("get_time", city))
        return f"{city}: 09:41"

    set_tracing_disabled(True)
    running = launch(["--max-sequences", "1"])
    try:
        client = AsyncOpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)
        agent = Agent(name="weather", tools=[get_weather, get_time], instructions=INSTRUCTIONS,
                      model=OpenAIChatCompletionsModel(model=running.name, openai_client=client),
                      model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required"))
        result = asyncio.run(Runner.run(agent, "What is the weather in Paris, and what time is it in Tokyo?", max_turns=6))
    finally:
        stop(running)
    assert sorted(calls) == [("get_time", "Tokyo"), ("get_weather", "Paris")], calls
    answer = result.final_output
    assert "18" in answer and "sunny" in answer and "09:41" in answer, answer

# Told only "call get_weather once, then report its result", the 1.5B model called it again at each turn.
REPORT = ("Call get_weather once. When you have its result, do not call any tool again: reply with a JSON object "
          "with the keys city, degrees and sky.")


def test_an_agent_with_an_output_type_returns_a_validated_answer():
    """An Agent with a tool and a Pydantic output_type: the SDK sends tools and a strict
    json_schema response_format together; after the required first call, the reply under "auto"
    is one grammar of calls or the answer under the schema (serve.tool_grammar), so the final
    output parses into the model and states the tool's result."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        degrees: int
        sky: str

    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city, in degrees Celsius."""
        calls.append(city)
        return f"{city}: 18 C, sunny"

    set_tracing_disabled(True)
    running = launch(["--max-sequences", "1"])
    try:
        client = AsyncOpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)
        agent = Agent(name="weather", tools=[get_weather], output_type=Weather,
                      instructions=REPORT,
                      model=OpenAIChatCompletionsModel(model=running.name, openai_client=client),
                      model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required"))
        result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    finally:
        stop(running)
    assert calls == ["Paris"], calls
    answer = result.final_output
    assert isinstance(answer, Weather) and answer.city == "Paris" and answer.degrees == 18, answer
    assert "sunny" in answer.sky.lower(), answer
