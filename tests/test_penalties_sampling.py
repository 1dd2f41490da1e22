"""Sampling with penalties and logit_bias stays exact under speculation: the tokens follow the
penalised target's own distribution. Tiny float32 pair of test_sampling_exactness (vocabulary 8,
a perturbed draft); the exact joint of the first four tokens is enumerated from the target's rows
through the same rules (each prefix's row penalised from that prefix), and N = 2000 speculative
generations are compared with it by a chi-square test per position and for positions 2+3 jointly
(cells with expected count < 5 merged, conform.check's functions). Threshold p > 1e-4 (a handful
of tests, seeds fixed); generations without the rules must fail the same test at p < 1e-6, which
shows the penalties move the distribution by more than the test resolves."""

import pytest
import torch
from test_sampling_exactness import POSITIONS, PROMPT, V, make_pair

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft, generate
from specdec.conform.check import sampling_pvalues
from specdec.decode.penalties import Penalties
from specdec.decode.ruled import rule_rows
from specdec.decode.sampling import SamplingConfig, probs

N, PASS, CAUGHT = 2000, 1e-4, 1e-6
PENALTIES = Penalties(presence=0.8, frequency=0.5, repetition=1.6, window=6, logit_bias=((3, 1.0), (5, -2.0)))
CFG = SamplingConfig(1.0)


@torch.inference_mode()
def ruled_joint(model, cfg: SamplingConfig) -> dict:
    """Exact P(x1..x4) of plain sampling from `model` with PENALTIES' rules."""
    rules = PENALTIES.rules(len(PROMPT), V)
    joint = {(): 1.0}
    for _ in range(POSITIONS):
        nxt = {}
        for prefix, weight in joint.items():
            tokens = torch.tensor(PROMPT + list(prefix))
            row = model(input_ids=tokens[None]).logits[:, -1].float()
            p = probs(rule_rows(rules, row, tokens, tokens.numel()), cfg)[0]
            nxt |= {prefix + (t,): weight * float(p[t]) for t in range(V) if p[t] > 0}
        joint = nxt
    return joint


def sampled(target, drafter, with_rules: bool = True) -> list[tuple[int, ...]]:
    return [tuple(generate(target, PROMPT, drafter=drafter, max_new_tokens=POSITIONS + 1, temperature=1.0, seed=i,
                           eos_token_id=[], rules=PENALTIES.rules(len(PROMPT), V) if with_rules else ()
                           ).new_tokens[:POSITIONS]) for i in range(N)]


@pytest.fixture(scope="module")
def pair():
    return make_pair(0)


@pytest.fixture(scope="module")
def exact(pair):
    return ruled_joint(pair[0], CFG)


PROPOSERS = {
    "draft": lambda draft: DraftModel(draft, 3),
    "tree": lambda draft: TreeDraft(DraftModel(draft, 3), 2),
    "hybrid": lambda draft: Hybrid(DraftModel(draft, 3), PromptLookup(3, max_ngram=2)),
}


@pytest.mark.parametrize("method", list(PROPOSERS))
def test_penalised_sampling_matches_the_penalised_target(pair, exact, method):
    target, draft = pair
    results = sampling_pvalues(sampled(target, PROPOSERS[method](draft)), exact)
    assert all("zero-probability" not in note for _, note in results.values()), results
    assert min(p for p, _ in results.values()) > PASS, results


def test_the_test_tells_penalised_from_plain_sampling(pair, exact):
    target, draft = pair
    results = sampling_pvalues(sampled(target, DraftModel(draft, 3), with_rules=False), exact)
    assert min(p for p, _ in results.values()) < CAUGHT, results
