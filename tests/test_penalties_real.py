"""Penalties and logit_bias on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, GGUF
on the native runtime): greedy speculation with them equals plain decoding with them, token for
token, for the draft, prompt lookup, hybrid and tree proposers (marked real: minutes)."""

import pytest

from specdec import Hybrid, PromptLookup, TreeDraft, generate
from specdec.decode.penalties import Penalties
from specdec.load.loaded import load
from specdec.load.spec import LoadSpec
from specdec.methods.spec import parse
from specdec.prompts.chat import encode_prompt

pytestmark = pytest.mark.real

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and two tests."
SETTINGS = [Penalties(presence=0.5, frequency=0.5), Penalties(repetition=1.15, window=64),
            Penalties(logit_bias=((198, -100.0), (13, 1.0)))]  # no "\n", more "."


@pytest.fixture(scope="module")
def pair():
    return load(LoadSpec(method=parse("draft:k=3")), say=lambda line: None)


@pytest.mark.parametrize("p", SETTINGS)
def test_real_pair_penalised_speculation_equals_penalised_plain(pair, p):
    prompt = encode_prompt(pair.tokenizer, PROMPT)
    draft = pair.proposer
    rules = lambda: p.rules(len(prompt), pair.lm().vocab_size)  # noqa: E731 - one set per generation
    plain = generate(pair.lm(), prompt, max_new_tokens=64, eos_token_id=[], rules=rules()).new_tokens
    assert plain != generate(pair.lm(), prompt, max_new_tokens=64, eos_token_id=[]).new_tokens
    for drafter in (draft, PromptLookup(3), Hybrid(draft, PromptLookup(3)), TreeDraft(draft, 2)):
        out = generate(pair.lm(), prompt, drafter=drafter, max_new_tokens=64, eos_token_id=[], rules=rules())
        assert out.new_tokens == plain, type(drafter).__name__
        if drafter is draft:
            assert out.stats.accepted > 0
