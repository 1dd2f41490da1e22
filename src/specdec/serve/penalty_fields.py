"""A request's penalty and bias fields -> decode.penalties.Penalties, each bounded (serve.fields):
OpenAI's presence_penalty and frequency_penalty (over the generated tokens) and logit_bias, vLLM's
repetition_penalty (over prompt and output), llama.cpp's repeat_penalty over its last
repeat_last_n tokens of prompt and output (64 unless given; -1: all of them; 0: off)."""

from __future__ import annotations

from ..decode.penalties import BIAS_RANGE, PENALTY_RANGE, Penalties
from .errors import invalid
from .fields import integer, number

MAX_REPETITION = 100.0  # a repetition penalty divides logits: far above ~2 every repeat is banned anyway
MAX_BIASED = 1024  # logit_bias entries a request may hold
REPEAT_LAST_N = 64  # llama-server's default window


def read_penalties(body: dict, vocab: int) -> Penalties:
    """The penalties a request asks for (all off when it names none)."""
    presence = number(body, "presence_penalty", 0.0, -PENALTY_RANGE, PENALTY_RANGE, "in [-2, 2] (0: off)")
    frequency = number(body, "frequency_penalty", 0.0, -PENALTY_RANGE, PENALTY_RANGE, "in [-2, 2] (0: off)")
    repetition, window = _repetition(body)
    return Penalties(presence, frequency, repetition, window, _logit_bias(body.get("logit_bias"), vocab))


def _repetition(body: dict) -> tuple[float, int | None]:
    """vLLM's repetition_penalty (window: everything) or llama.cpp's repeat_penalty (window:
    repeat_last_n); 1 means off, and a request may turn on one of them."""
    rule = f"> 0 and <= {MAX_REPETITION:g} (1: off; 1.1 is a usual value)"
    vllm = number(body, "repetition_penalty", 1.0, 0, MAX_REPETITION, rule)
    llama = number(body, "repeat_penalty", 1.0, 0, MAX_REPETITION, rule)
    for name, value in (("repetition_penalty", vllm), ("repeat_penalty", llama)):
        if value == 0:
            raise invalid(f"{name} must be {rule}, got 0", name)
    if vllm != 1 and llama != 1:
        raise invalid("repetition_penalty (vLLM's, over prompt and output) and repeat_penalty (llama.cpp's, over "
                      "the last repeat_last_n tokens) are two spellings of one penalty: send one of them",
                      "repeat_penalty")
    last_n = integer(body, "repeat_last_n", -1, 2**31 - 1)
    if vllm != 1:
        return vllm, None
    window = REPEAT_LAST_N if last_n is None else None if last_n == -1 else last_n
    return llama, window


def _logit_bias(value: object, vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} map, ids in the vocabulary, biases in [-100, 100]."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise invalid('logit_bias must be an object mapping token ids to biases, such as {"50256": -100}',
                      "logit_bias")
    if len(value) > MAX_BIASED:
        raise invalid(f"logit_bias may hold at most {MAX_BIASED} token ids, got {len(value)}", "logit_bias")
    out = []
    for key, bias in value.items():
        where = f"logit_bias[{key[:20]!r}]"
        try:
            token = int(key)
        except ValueError:
            raise invalid(f"{where}: keys must be token ids written as integers, such as \"50256\"",
                          "logit_bias") from None
        if not 0 <= token < vocab:
            raise invalid(f"{where}: token id {token} is outside the vocabulary: ids must lie in [0, {vocab})",
                          "logit_bias", "invalid_token_id")
        if bias is None:
            raise invalid(f"{where} must be a number in [-100, 100]", "logit_bias")
        out.append((token, number({where: bias}, where, None, -BIAS_RANGE, BIAS_RANGE, "in [-100, 100]")))
    return tuple(out)
