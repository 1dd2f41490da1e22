"""Sampling under a grammar through `specdec serve` is exact: seeded requests with vLLM's
guided_choice at temperature 1 return each choice as often as the constrained target says,
speculative (draft:k=3) and plain alike.

The tiny GGUF pair of tests/serve_native.py (random weights); completions requests with the
prompt "Pick: ", guided_choice CHOICES, seeds 0..N-1, N = 600 per server. The exact probability
of each choice is enumerated from the target's logits in this process: every token path the
grammar allows (each row masked by a fresh rule of the same grammar, then softmax; non-canonical
tokenizations of a choice included) down to the end token, the paths' weights summed by the
text they spell. The returned choices' counts are compared with it by chi-square (5 cells, none
expected under 5); each server's p-value must be > 1e-4. The test can fail: the same speculative
samples against the distribution an unmasked sampler would give (each choice's canonical tokens
under the unmasked softmax, renormalised over the choices) give p < 1e-6.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from serve_native import start_native, stop, target_alone

from specdec.conform.check import chi2_pvalue
from specdec.constrain import choice, grammar_rule
from specdec.decode.sampling import SamplingConfig, probs

N, PASS, FAIL = 600, 1e-4, 1e-6
PROMPT = "Pick: "
CHOICES = ["red", "green", "blue", "grey", "black"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-structured-sampling")


@pytest.fixture(scope="module")
def alone(folder):
    """The target and tokenizer of the served files (written here first)."""
    running = start_native(folder)
    stop(running)
    return target_alone(folder)


@torch.inference_mode()
def exact(alone) -> dict[str, float]:
    """P(choice) of plain sampling at temperature 1 under the grammar, over every token path."""
    lm, tokenizer = alone
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    grammar, ends = choice(CHOICES), set(lm.eos_token_ids)
    out: dict[str, float] = {}
    frontier = [((), 1.0)]
    while frontier:
        prefix, weight = frontier.pop()
        tokens = torch.tensor(prompt + list(prefix))
        rule = grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, len(prompt))
        p = probs(rule.apply(lm.prefill(tokens)[-1:].clone(), tokens, tokens.numel()), SamplingConfig(1.0))[0]
        for t in p.nonzero().flatten().tolist():
            if t in ends:
                text = tokenizer.decode(list(prefix))
                out[text] = out.get(text, 0.0) + weight * float(p[t])
            else:
                frontier.append((prefix + (t,), weight * float(p[t])))
    return out


@torch.inference_mode()
def unmasked(alone) -> dict[str, float]:
    """The wrong distribution: each choice's canonical tokens under the unmasked softmax,
    renormalised over the choices."""
    lm, tokenizer = alone
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    weights = {}
    for text in CHOICES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        weight = 1.0
        for i, t in enumerate(ids):
            weight *= float(torch.softmax(lm.prefill(torch.tensor(prompt + ids[:i]))[-1].float(), -1)[t])
        weights[text] = weight
    total = sum(weights.values())
    return {text: w / total for text, w in weights.items()}


def sampled(running) -> Counter:
    client = running.client()
    return Counter(client.completions.create(model=running.name, prompt=PROMPT, max_tokens=8, temperature=1, seed=i,
                                             extra_body={"guided_choice": CHOICES}).choices[0].text for i in range(N))


@pytest.mark.parametrize("proposer", ["draft:k=3", "none"], ids=["speculative", "plain"])
def test_guided_choices_follow_the_constrained_target(folder, alone, proposer):
    expected = exact(alone)
    assert set(expected) == set(CHOICES) and abs(sum(expected.values()) - 1) < 1e-4, expected
    assert min(expected.values()) * N >= 5  # no merged cells: the test sees every choice
    running = start_native(folder, "--proposer", proposer)
    try:
        counts = sampled(running)
    finally:
        stop(running)
    p, note = chi2_pvalue(counts, expected, N)
    assert p > PASS, (p, note, counts, expected)
    if proposer != "none":
        wrong, _ = chi2_pvalue(counts, unmasked(alone), N)
        assert wrong < FAIL, (wrong, counts, unmasked(alone))
