"""Penalties and logit_bias through `specdec serve` (the tiny GGUF pair, draft:k=3, greedy) with
the official openai client: accepted, effective, and the reply equal to the target alone
decoding with the same rules (decode.penalties), so speculation changed nothing."""

from __future__ import annotations

import pytest
from serve_native import start_native, stop, target_alone

from specdec import generate
from specdec.decode.penalties import Penalties
from specdec.prompts.chat import encode_prompt

PROMPT = "the cat sat on the mat and the cat sat on the"
TOKENS = 24


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-penalties")


@pytest.fixture(scope="module")
def served(gguf):
    running = start_native(gguf)
    yield running
    stop(running)


@pytest.fixture(scope="module")
def alone(gguf):
    return target_alone(gguf)


def served_ids(served, **fields) -> list[int]:
    """The token ids of a greedy completion of PROMPT with `fields` (extra_body: the rest)."""
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True, **fields.pop("extra_body", {})}
    reply = served.client().completions.create(model=served.name, prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                                               logprobs=0, extra_body=extra, **fields)
    return [int(t.split(":")[1]) for t in reply.choices[0].logprobs.tokens]


def alone_ids(alone, penalties: Penalties) -> list[int]:
    lm, tokenizer = alone
    prompt = encode_prompt(tokenizer, PROMPT, raw=True)
    return generate(lm, prompt, max_new_tokens=TOKENS, eos_token_id=[],
                    rules=penalties.rules(len(prompt), lm.vocab_size)).new_tokens


@pytest.mark.parametrize("fields, penalties", [
    ({"frequency_penalty": 1.5, "presence_penalty": 0.5}, Penalties(presence=0.5, frequency=1.5)),
    ({"extra_body": {"repeat_penalty": 1.5, "repeat_last_n": 8}}, Penalties(repetition=1.5, window=8)),
    ({"extra_body": {"repetition_penalty": 1.5}}, Penalties(repetition=1.5)),
    ({"extra_body": {"repeat_penalty": 1.5}}, Penalties(repetition=1.5, window=64)),  # llama-server's default window
])
def test_penalties_are_applied_as_the_target_alone_applies_them(served, alone, fields, penalties):
    got = served_ids(served, **fields)
    assert got == alone_ids(alone, penalties)
    assert got != served_ids(served)  # they changed the reply


def test_logit_bias_forces_and_bans_tokens(served, alone):
    plain = served_ids(served)
    forced = next(t for t in range(300, 2048) if t not in plain)
    assert served_ids(served, logit_bias={str(forced): 100}) == [forced] * TOKENS
    banned = served_ids(served, logit_bias={str(plain[0]): -100})
    assert plain[0] not in banned
    assert banned == alone_ids(alone, Penalties(logit_bias=((plain[0], -100.0),)))
    chat = served.client().chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0,
        logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == alone[1].decode([forced] * 8, skip_special_tokens=True)
