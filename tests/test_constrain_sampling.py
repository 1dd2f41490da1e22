"""Sampling under a grammar is exact under speculation: the tokens speculative sampling returns
with a grammar's rule follow the constrained target's own distribution (each row masked, then
softmax at temperature 1).

The tiny GGUF pair of tests/serve_native.py on the native runtime (random weights; the one-layer
draft shares the target's first layer, so guesses are accepted and rejected); the grammar
`("a" | "b" | "c") ("x" | "y" | "z") ("a" | "b")` in SmolLM2's cut vocabulary; the exact joint of the
first four new tokens enumerated from the target's logits through a fresh rule per prefix; N = 2000
generations with the draft (k = 3) and seeds 0..N-1 compared with it by chi-square per position and
for positions 2+3 jointly (specdec.conform.check, cells under 5 expected merged): every p-value must
be > 1e-4 (as tests/test_sampling_exactness.py). The same samples drawn without the grammar fall
outside its support (the test can fail)."""

from __future__ import annotations

import pytest
import torch
from serve_native import gguf_pair, model_cache, tiny_models

from specdec import DraftModel, generate
from specdec.conform.check import sampling_pvalues
from specdec.constrain import gbnf, grammar_rule
from specdec.decode.sampling import SamplingConfig, probs

N, POSITIONS, PASS = 2000, 4, 1e-4
GRAMMAR = gbnf('root ::= ("a" | "b" | "c") ("x" | "y" | "z") ("a" | "b")')


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from specdec.runtime import load_gguf

    folder = tmp_path_factory.mktemp("constrain-sampling")
    lm, draft, tokenizer = tiny_models(folder)
    # the draft's full head, and a head without the tokens the grammar allows first
    with model_cache(folder):
        narrow = load_gguf(gguf_pair(folder)[1], head_ids=head_without_the_first_letters(lm, tokenizer))
    return lm, draft, narrow, tokenizer


def rule(lm, tokenizer, prompt_length: int):
    return grammar_rule(GRAMMAR, tokenizer, lm.vocab_size, lm.eos_token_ids, prompt_length)


@torch.inference_mode()
def constrained_joint(lm, tokenizer, prompt: list[int]) -> dict:
    """Exact P(x1..x4) of plain sampling at temperature 1 under the grammar."""
    joint = {(): 1.0}
    for _ in range(POSITIONS):
        grown = {}
        for prefix, weight in joint.items():
            tokens = torch.tensor(prompt + list(prefix))
            row = rule(lm, tokenizer, len(prompt)).apply(lm.prefill(tokens)[-1:].clone(), tokens, tokens.numel())
            p = probs(row, SamplingConfig(1.0))[0]
            for t in p.nonzero().flatten().tolist():
                grown[prefix + (t,)] = weight * float(p[t])
        joint = grown
    return joint


def head_without_the_first_letters(lm, tokenizer) -> torch.Tensor:
    """A restricted draft head holding none of the tokens the grammar allows first (a, b, c and
    their merges): its ruled first row has no finite entry."""
    banned = {t for t in range(lm.vocab_size) if tokenizer.decode([t]).strip() and
              tokenizer.decode([t])[0] in "abc"}
    return torch.tensor([t for t in range(lm.vocab_size) if t not in banned])


@pytest.mark.parametrize("head", [False, True])
def test_speculative_sampling_under_a_grammar_follows_the_constrained_target(tiny, head):
    """With the restricted head, the draft's first ruled row is empty (decode.ruled then sends its
    own row: every first guess rejected, the residual the target's row)."""
    target, full, restricted, tokenizer = tiny
    draft = restricted if head else full
    prompt = tokenizer.encode("Pick: ", add_special_tokens=False)
    exact = constrained_joint(target, tokenizer, prompt)
    assert len({k[:3] for k in exact}) >= 12  # the grammar's 18 strings, some as other tokenizations

    accepted = proposed = 0

    def sample(constrained: bool, n: int) -> list[tuple[int, ...]]:
        nonlocal accepted, proposed
        out = []
        for i in range(n):
            result = generate(target, prompt, drafter=DraftModel(draft, 3), max_new_tokens=POSITIONS + 1,
                              temperature=1.0, seed=i, eos_token_id=[],
                              rules=(rule(target, tokenizer, len(prompt)),) if constrained else ())
            accepted, proposed = accepted + result.stats.accepted, proposed + result.stats.proposed
            out.append(tuple(result.new_tokens[:POSITIONS]))
        return out

    results = sampling_pvalues(sample(True, N), exact)
    assert min(p for p, _ in results.values()) > PASS, results
    assert 0 < accepted < proposed  # guesses accepted and rejected
    unconstrained = sampling_pvalues(sample(False, 200), exact)
    assert any("zero-probability" in note for _, note in unconstrained.values()), unconstrained
