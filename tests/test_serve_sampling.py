"""Sampling through `specdec serve` is exact: the tokens a server returns at temperature > 0, with
top-k, top-p and min-p all set, follow the target's own distribution, for plain decoding and for
speculative decoding alike.

Tiny float32 models saved as folders and served on 127.0.0.1 as test_serve.py serves them:
one layer, vocabulary 16, init 0.3, so the target's rows are neither flat nor a point mass;
the draft is the target plus weight noise (about half its guesses accepted). Each server gets
N = 1000 completions requests, prompt given as token ids, seeds 0..N-1, temperature 0.9,
top_k 6, top_p 0.9, min_p 0.15 (each filter removes tokens the other two keep; the first token
has 4 possible values), `ignore_eos`, token ids read back from the logprobs entries. The exact
joint distribution of the first four new tokens is enumerated from the target's logits
(specdec.conform.check, as `specdec check` and tests/test_sampling_exactness.py do) and
compared with the N returned sequences by scipy.stats.chisquare per position and for positions
2+3 jointly (cells with an expected count under 5 merged): 5 p-values per server, each must be
> 1e-3 (10 tests, so a false alarm has probability < 1%; the seeds are fixed, so a run repeats
exactly). About 35 s on 2 cores.

It fails on a broken server. Measured with these N and seeds (the smallest of the 5 p-values;
the correct servers: 0.21 plain, 0.28 speculative): a filter dropped (top_k, top_p or min_p
on the plain server, min_p on the speculative one) 0, a token outside the target's support;
after a rejection, drawing from p instead of the residual (p - q)+: 1.4e-16; draft tokens
drawn from the unfiltered q while the verifier judges them by the filtered one: 1.6e-10.
test_a_dropped_filter_is_caught keeps one of these in the suite.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from conftest import perturbed, tiny_model
from test_serve import start, stop

from specdec.conform.check import exact_joint, sampling_pvalues
from specdec.decode.sampling import SamplingConfig

V, POSITIONS, N = 16, 4, 1000
PROMPT = list(range(V)) * 2
CFG = SamplingConfig(0.9, top_k=6, top_p=0.9, min_p=0.15)
PASS = 1e-3


def letter_tokenizer():
    """A word-level tokenizer of V - 2 one-letter tokens, <unk> and the special token the
    loader adds: V ids (the server needs a tokenizer; prompts here are token ids)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", *"bcdefghijklmno"]  # and one special token the loader adds: V
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("serve-sampling")
    target = tiny_model(11, vocab=V, layers=1, init=0.3)
    for name, model in (("target", target), ("draft", perturbed(target, seed=0, scale=0.1))):
        model.save_pretrained(root / name)
        letter_tokenizer().save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


@pytest.fixture(scope="module")
def exact(folders) -> dict:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(folders[0], dtype=torch.float32).eval()
    return exact_joint(target, PROMPT, CFG, POSITIONS)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


def served_samples(folders, method: str, n: int = N) -> tuple[list[tuple[int, ...]], dict]:
    """n seeded requests to a server of `method`: the first POSITIONS token ids of each, and the
    summed speculation figures."""
    running = start(folders, "--proposer", method)
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
def test_served_sampling_follows_the_target(folders, exact, method):
    samples, totals = served_samples(folders, method)
    ps = pvalues(samples, exact)
    assert min(ps.values()) > PASS, ps
    if method != "ar":  # the test means something only if rounds accept and reject
        assert 0 < totals["draft_n_accepted"] < totals["draft_n"], totals


def test_a_dropped_filter_is_caught(folders, exact, monkeypatch):
    """The same test on a server whose sampling forgets min_p: it generates tokens the target
    never would (200 requests suffice)."""
    import dataclasses

    from specdec.decode import sampling

    filtered = sampling.filtered
    monkeypatch.setattr(sampling, "filtered", lambda logits, cfg: filtered(logits, dataclasses.replace(cfg, min_p=None)))
    samples, _ = served_samples(folders, "ar", n=200)
    results = sampling_pvalues(samples, exact)
    assert min(p for p, _ in results.values()) < 1e-6, results
