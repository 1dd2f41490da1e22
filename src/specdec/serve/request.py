"""A request's JSON -> Generation, what the worker decodes; every field checked and bounded
(serve.fields: integers within int64, numbers finite and in range, text valid Unicode), a bad
one a 4xx ApiError that names the field and says what to send instead, so nothing a client sends
can raise in the worker. A temperature below GREEDY_BELOW decodes greedily.

`n` asks for several choices of one prompt (up to MAX_CHOICES): the worker decodes them as n
sequences sharing the prompt (serve.rounds), choice i sampling with seed + i where a seed is set.
Fields this server does not implement are refused when they would change the output (best_of
other than n, echo, suffix), so a client never gets a silently different completion; fields
that change nothing here (user, metadata, llama.cpp's cache_prompt, ...) and unknown fields are
ignored, as vLLM and llama-server do. Absent sampling fields take the server's defaults (`specdec serve
--temperature/--top-k/--top-p/--seed`, `--max-new-tokens` for max_tokens), so a server can be
started greedy or sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..constrain import Grammar
from ..decode.penalties import Penalties
from ..decode.sampling import GREEDY_BELOW
from .errors import ApiError, invalid
from .fields import check_text, flag, integer, number
from .penalty_fields import read_penalties
from .response_format import read_grammar
from .messages import read_messages
from .tool_grammar import tool_grammar
from .tools import ToolUse, read_tools

COMPLETIONS, CHAT = "completions", "chat"
MAX_LOGPROBS = 20  # alternatives per token, as vLLM's default limit
MAX_STOPS = 16
MAX_STOP_CHARS = 256  # each stop string's length: the text stream holds back up to this much per token
MAX_TEMPERATURE = 100.0  # OpenAI's range ends at 2; far above, float32 logits / T only flattens further
MAX_CHOICES = 16  # n: each choice is a sequence of its own (a lane, its K/V), decoded beside the others


@dataclass(frozen=True)
class Defaults:
    """The server's sampling defaults (the command line's), for fields a request leaves out."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Model:
    """What requests are checked against: the served name, the target's vocabulary (logits
    width) and context."""

    name: str
    vocab_size: int
    context: int | None
    defaults: Defaults = field(default_factory=Defaults)


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    seed: int | None


@dataclass(frozen=True)
class Generation:
    api: str  # COMPLETIONS or CHAT
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    logprobs: int | None = None  # alternatives per token (0: the chosen token's only); None: no logprobs
    ids_as_tokens: bool = False  # vLLM's return_tokens_as_token_ids: tokens spelled token_id:N
    ignore_eos: bool = False
    penalties: Penalties = field(default_factory=Penalties)  # presence/frequency/repetition, logit_bias
    tool_use: ToolUse | None = None  # chat with tools: the model's call format, the reply parsed into calls
    grammar: Grammar | None = None  # what the output must match (response_format, grammar: serve.response_format)
    n: int = 1  # choices: n sequences of the prompt, choice i seeded with seed + i


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed choice `index` of a request samples with: seed + index (vLLM's rule), so each
    choice equals a lone request with that seed and no two choices share a generator."""
    return None if seed is None else seed + index


# Fields that would change the output and are not implemented: refused unless they hold the
# value that means "off". Each maps to (is it off?, what to do instead).
_REFUSED = {
    "echo": (lambda v: not v, "echo is not supported: the reply never repeats the prompt; leave it out"),
    "suffix": (lambda v: not v, "suffix (insertion) is not supported: leave it out"),
    "functions": (lambda v: not v, "functions (the old form of tools) are not supported: send them as tools"),
    "function_call": (lambda v: v in (None, "none"), "function_call (the old form of tool_choice) is not supported: "
                                                     "send tool_choice"),
}
_COMPLETIONS_ONLY = {"echo", "suffix"}  # chat has no such fields: ignored there


def read_request(body: object, api: str, model: Model, encode_text, encode_chat) -> Generation:
    """The Generation a completions (`api` COMPLETIONS) or chat request asks for. `encode_text(str)`
    and `encode_chat(messages, tools)` turn a prompt into token ids (the tokenizer's work;
    encode_chat also returns the ToolUse of the tools, and raises ApiError where the model cannot
    take the messages or tools)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_json")
    check_text(body)
    _check_model(body.get("model"), model)
    for name, (off, why) in _REFUSED.items():
        if name in body and not off(body[name]) and not (api == CHAT and name in _COMPLETIONS_ONLY):
            raise invalid(why, name, "unsupported_parameter")
    n = _choices(body, api)
    grammar = read_grammar(body)
    tool_use = None
    if api == COMPLETIONS:
        prompt = _completion_prompt(body, model, encode_text)
        logprobs = integer(body, "logprobs", 0, MAX_LOGPROBS)
    else:
        tools = read_tools(body)
        prompt, tool_use = encode_chat(read_messages(body), tools)
        grammar = _with_tools(grammar, tool_use)
        logprobs = _chat_logprobs(body)
    if not prompt:
        raise invalid("the prompt encodes to no tokens: send some text", "prompt" if api == COMPLETIONS else "messages",
                      "empty_prompt")
    max_tokens = _max_tokens(body, api, model, len(prompt))
    stream = flag(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options must be an object such as {\"include_usage\": true}", "stream_options")
    include_usage = bool(stream and options and flag(options, "include_usage", False, "stream_options.include_usage"))
    return Generation(
        api=api, prompt_ids=tuple(prompt), max_tokens=max_tokens, sampling=_sampling(body, model),
        penalties=read_penalties(body, model.vocab_size),
        stop=_stops(body) + (tool_use.stops if tool_use else ()), stream=stream, include_usage=include_usage,
        logprobs=logprobs, ids_as_tokens=flag(body, "return_tokens_as_token_ids", False),
        ignore_eos=flag(body, "ignore_eos", False), tool_use=tool_use, grammar=grammar, n=n,
    )


def _choices(body: dict, api: str) -> int:
    """n, the choices asked for; completions' best_of only where it changes nothing (equal to n:
    every candidate decoded is returned, none ranked away)."""
    n = integer(body, "n")
    n = 1 if n is None else n
    if not 1 <= n <= MAX_CHOICES:
        raise invalid(f"n must be between 1 and {MAX_CHOICES} (choices of one prompt), got {n}: send several "
                      "requests for more", "n")
    best_of = body.get("best_of") if api == COMPLETIONS else None
    if best_of is not None and (isinstance(best_of, bool) or best_of != n):
        raise invalid(f"best_of other than n is not supported (got best_of {best_of!r}, n {n}): every choice "
                      "decoded is returned, none ranked away; leave best_of out", "best_of", "unsupported_parameter")
    return n


def _check_model(name: object, model: Model) -> None:
    if name is None:
        return
    if not isinstance(name, str):
        raise invalid(f"model must be a string: this server serves {model.name!r}", "model")
    if name != model.name:
        raise ApiError(404, f"the model {name!r} does not exist here: this server serves {model.name!r} "
                            "(GET /v1/models lists it)", "model", "model_not_found")


def _completion_prompt(body: dict, model: Model, encode_text) -> list[int]:
    if "prompt" not in body or body["prompt"] is None:
        raise invalid("prompt is missing: send the text (or a list of token ids) to complete", "prompt", "missing_prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > 1:
            raise invalid(f"a batch of {len(prompt)} prompts is not supported: send one prompt per request",
                          "prompt", "unsupported_parameter")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise invalid("the prompt is empty: send some text to complete", "prompt", "empty_prompt")
        return list(encode_text(prompt))
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("the prompt is an empty list: send at least one token id", "prompt", "empty_prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise invalid("prompt must be a string or a list of integer token ids", "prompt")
        bad = next((t for t in prompt if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise invalid(f"token id {bad} is outside the vocabulary: ids must lie in [0, {model.vocab_size}) "
                          "(was the prompt encoded with this model's tokenizer?)", "prompt", "invalid_token_id")
        return prompt
    raise invalid("prompt must be a string or a list of integer token ids", "prompt")


def _with_tools(grammar: Grammar | None, tool_use: ToolUse | None) -> Grammar | None:
    """The reply's grammar: the tool calls' (with a JSON response format's answer as their
    alternative: serve.tool_grammar), else the response format's."""
    return tool_grammar(tool_use, grammar) if tool_use is not None else grammar


def _chat_logprobs(body: dict) -> int | None:
    wanted = flag(body, "logprobs", False)
    top = integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _max_tokens(body: dict, api: str, model: Model, prompt_tokens: int) -> int:
    name = "max_completion_tokens" if api == CHAT and body.get("max_completion_tokens") is not None else "max_tokens"
    asked = integer(body, name)
    context = model.context
    if context is not None and prompt_tokens >= context:
        raise invalid(f"the prompt has {prompt_tokens} tokens but the model's context is {context}: shorten it",
                      "messages" if api == CHAT else "prompt", "context_length_exceeded")
    if asked is None:
        room = context - prompt_tokens if context is not None else model.defaults.max_tokens
        return max(1, min(model.defaults.max_tokens, room))
    if asked < 1:
        raise invalid(f"{name} must be >= 1, got {asked}", name)
    if context is not None and prompt_tokens + asked > context:
        raise invalid(f"the model's context is {context} tokens, but {prompt_tokens} in the prompt plus {name} "
                      f"{asked} is {prompt_tokens + asked}: lower {name} to at most {context - prompt_tokens} "
                      "or shorten the prompt", name, "context_length_exceeded")
    return asked


def _sampling(body: dict, model: Model) -> Sampling:
    d = model.defaults
    temperature = number(body, "temperature", d.temperature, 0, MAX_TEMPERATURE,
                         f">= 0 and <= {MAX_TEMPERATURE:g} (0 means greedy)")
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    top_p = number(body, "top_p", d.top_p, 0, 1, "in (0, 1]")
    if top_p == 0:
        raise invalid("top_p must be in (0, 1], got 0", "top_p")
    top_k = integer(body, "top_k")
    if top_k is None:
        top_k = d.top_k
    elif top_k in (0, -1) or top_k >= model.vocab_size:  # vLLM's and llama.cpp's spellings of "off"; or all tokens
        top_k = None
    elif top_k < 1:
        raise invalid(f"top_k must be >= 1 (or 0 / -1: off), got {top_k}", "top_k")
    min_p = number(body, "min_p", d.min_p, 0, 1, "in [0, 1) (0: off; 0.05 is llama.cpp's default)")
    if min_p == 1:
        raise invalid("min_p must be in [0, 1) (0: off; 0.05 is llama.cpp's default), got 1", "min_p")
    if min_p == 0:
        min_p = None
    seed = integer(body, "seed")
    return Sampling(temperature, top_k, None if top_p == 1 else top_p, min_p, d.seed if seed is None else seed)


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise invalid(f"at most {MAX_STOPS} stop strings, got {len(stops)}", "stop")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise invalid(f"a stop string may have at most {MAX_STOP_CHARS} characters, got one of {longest}", "stop")
    return tuple(s for s in stops if s)
