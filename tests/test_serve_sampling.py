"""Sampling through `specdec serve` is exact: the tokens a server returns at temperature > 0, with
top-k, top-p and min-p all set, follow the target's own distribution, for plain decoding and for
speculative decoding alike.

Served on specdec's native runtime (tests/serve_native.py) from tiny GGUF files written here with a
vocabulary of 16 tokens (13 of SmolLM2's special tokens, one merge and its two parts), so the
target's rows are neither flat nor a point mass: a two-layer qwen2 target (seed 8) and a one-layer
draft drawn from the same seed (it shares the target's embeddings, first layer and output, so some
of its guesses are accepted and some rejected). Each server gets N = 1000 completions requests,
prompt given as token ids, seeds 0..N-1, temperature 0.9, top_k 6, top_p 0.9, min_p 0.15 (at the
first token top_k drops 3 of the 8 tokens the others keep, top_p 1 of 6; min_p drops tokens at later
positions: without it a quarter of the mass of the four-token sequences lies outside the exact
support), `ignore_eos`, token ids read back from the logprobs entries. The exact joint distribution
of the first four new tokens is enumerated from the target's logits (specdec.conform.check, as
`specdec check` and tests/test_sampling_exactness.py do; the target runtime loaded in process) and
compared with the N returned sequences by scipy.stats.chisquare per position and for positions
2+3 jointly (cells with an expected count under 5 merged): 5 p-values per server, each must be
> 1e-3 (10 tests, so a false alarm has probability < 1%; the seeds are fixed, so a run repeats
exactly).

It fails on a broken server: test_a_dropped_filter_is_caught serves a sampler that forgets min_p
(200 requests) and finds tokens outside the target's support.
"""

from __future__ import annotations

import httpx
import pytest
from gguf_files import T, tokenizer_fields, write_model
from serve_native import start_native, stop, target_alone

from specdec.conform.check import exact_joint, sampling_pvalues
from specdec.decode.sampling import SamplingConfig

V, POSITIONS, N = 16, 4, 1000
PROMPT = list(range(V)) * 2
CFG = SamplingConfig(0.9, top_k=6, top_p=0.9, min_p=0.15)
PASS = 1e-3
SEED = 8  # of the tiny files' weights: each filter drops tokens the other two keep (module docstring)


def sixteen_tokens() -> list[str]:
    """V tokens that make a whole byte-level BPE tokenizer: SmolLM2's first special tokens, and its
    first merge with the two tokens it joins."""
    fields = tokenizer_fields()
    a, b = fields["merges"][0].split(" ")
    return [*fields["tokens"][: V - 3], a, b, a + b]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder of the served GGUF pair (serve_native's names) and its prepared parts."""
    root = tmp_path_factory.mktemp("serve-sampling")
    write_model(root / "target.gguf", "qwen2", T.Q8_0, seed=SEED, tokens=sixteen_tokens())
    write_model(root / "draft.gguf", "qwen2", T.Q8_0, seed=SEED, tokens=sixteen_tokens(), layers=1)
    return root


@pytest.fixture(scope="module")
def exact(folder) -> dict:
    target, _ = target_alone(folder)
    return exact_joint(target, PROMPT, CFG, POSITIONS)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


def served_samples(folder, method: str, n: int = N) -> tuple[list[tuple[int, ...]], dict]:
    """n seeded requests to a server of `method`: the first POSITIONS token ids of each, and the
    summed speculation figures."""
    running = start_native(folder, "--proposer", method)
    body = {"model": running.name, "prompt": PROMPT, "max_tokens": POSITIONS + 1, "temperature": CFG.temperature,
            "top_k": CFG.top_k, "top_p": CFG.top_p, "min_p": CFG.min_p, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    samples, totals = [], {"rounds": 0, "draft_n": 0, "draft_n_accepted": 0}
    try:
        with httpx.Client(base_url=running.url, timeout=30) as http:
            for seed in range(n):
                reply = http.post("/v1/completions", json={**body, "seed": seed})
                assert reply.status_code == 200, reply.text
                out = reply.json()
                tokens = [int(t.removeprefix("token_id:")) for t in out["choices"][0]["logprobs"]["tokens"]]
                assert len(tokens) == POSITIONS + 1
                samples.append(tuple(tokens[:POSITIONS]))
                for name in totals:
                    totals[name] += out["timings"][name]
    finally:
        stop(running)
    return samples, totals


def pvalues(samples, exact) -> dict[str, float]:
    results = sampling_pvalues(samples, exact)
    assert all("zero-probability" not in note for _, note in results.values()), results
    assert all(note != "one outcome only" for _, note in results.values()), results
    return {name: p for name, (p, _) in results.items()}


@pytest.mark.parametrize("method", ["ar", "draft:k=3"])
def test_served_sampling_follows_the_target(folder, exact, method):
    samples, totals = served_samples(folder, method)
    ps = pvalues(samples, exact)
    assert min(ps.values()) > PASS, ps
    if method != "ar":  # the test means something only if rounds accept and reject
        assert 0 < totals["draft_n_accepted"] < totals["draft_n"], totals


def test_a_dropped_filter_is_caught(folder, exact, monkeypatch):
    """The same test on a server whose sampling forgets min_p: it generates tokens the target
    never would (200 requests suffice)."""
    import dataclasses

    from specdec.decode import sampling

    filtered = sampling.filtered
    monkeypatch.setattr(sampling, "filtered", lambda logits, cfg: filtered(logits, dataclasses.replace(cfg, min_p=None)))
    samples, _ = served_samples(folder, "ar", n=200)
    results = sampling_pvalues(samples, exact)
    assert min(p for p, _ in results.values()) < 1e-6, results
