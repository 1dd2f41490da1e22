"""The suffix proposer: its memory's match and continuation against a brute-force scan, the
memory's bound, and lossless decoding through specdec.generate (tiny float32 models)."""

import math
from collections import Counter

import httpx
import numpy as np
import pytest
import torch
from conftest import perturbed, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sampling_exactness import CONFIGS, PASS, PROMPT, make_pair, pvalues

from specdec import DraftModel, generate
from specdec.errors import SpecdecError
from specdec.methods.build import build_proposer
from specdec.methods.spec import parse
from specdec.proposers import SuffixHybrid, SuffixProposer
from specdec.proposers.suffix_store import SuffixStore


def brute(streams: list[list[int]], seq: list[int], k: int, max_depth: int, floor: float,
          factor: float) -> tuple[list[int], float]:
    """The longest suffix of seq (<= max_depth) followed by a token somewhere in the streams or
    earlier in seq, then the frequency-weighted path from all its occurrences, by direct scan."""
    texts = [*streams, seq]
    for depth in range(min(max_depth, len(seq)), 0, -1):
        found = [(t, end) for t in texts for end in range(depth, len(t)) if t[end - depth:end] == seq[-depth:]]
        if found:
            break
    else:
        return [], 0.0
    tokens, path, expected = [], 1.0, 0.0
    while len(tokens) < min(k, math.ceil(factor * depth)):
        step = len(tokens)
        counts = Counter(t[end + step] for t, end in found if end + step < len(t))
        if not counts:
            break
        token = min(counts, key=lambda v: (-counts[v], v))  # most frequent, then smallest id
        share = counts[token] / sum(counts.values())
        if path * share < floor:
            break
        path *= share
        expected += path
        tokens.append(token)
        found = [(t, end) for t, end in found if end + step < len(t) and t[end + step] == token]
    return tokens, expected


stream = st.lists(st.integers(0, 3), max_size=30)


@st.composite
def memories(draw) -> tuple[list[list[int]], list[int]]:
    """Streams over a small alphabet, some holding pieces of the sequence (so matches run long)."""
    seq = draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
    streams = draw(st.lists(stream, max_size=6))
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, len(seq) - 1))
        piece = seq[start : draw(st.integers(start + 1, len(seq)))]
        streams.append(draw(stream) + piece + draw(stream))
    return draw(st.permutations(streams)), seq


@settings(max_examples=400, deadline=None)
@given(memory=memories(), k=st.integers(1, 10), max_depth=st.integers(1, 24),
       floor=st.sampled_from([0.05, 0.3, 0.6, 1.0]), factor=st.sampled_from([0.5, 1.0, 3.0]))
def test_match_and_continuation_equal_a_brute_force_scan(memory, k, max_depth, floor, factor):
    streams, seq = memory
    proposer = SuffixProposer(k, max_depth=max_depth, floor=floor, factor=factor)
    for s in streams:
        proposer.finish(s)
    tokens, expected = proposer.guess(np.array(seq), k)
    want, want_expected = brute(streams, seq, k, max_depth, floor, factor)
    assert tokens == want
    assert expected == pytest.approx(want_expected)


@settings(max_examples=200, deadline=None)
@given(streams=st.lists(stream, min_size=1, max_size=8), max_tokens=st.integers(1, 40),
       seq=st.lists(st.integers(0, 3), min_size=1, max_size=20))
def test_eviction_keeps_the_latest_streams_within_the_bound(streams, max_tokens, seq):
    store = SuffixStore(max_tokens)
    for s in streams:
        store.add(s)
        assert store.tokens <= max_tokens
    kept, total = [], 0  # the most recent streams that fit, the newest cut to the bound
    for s in reversed(streams):
        s = s[-max_tokens:]
        if total + len(s) > max_tokens:
            break
        kept.insert(0, s)
        total += len(s)
    assert store.tokens == total
    tokens, expected = SuffixProposer(8, store=store, floor=0.05, factor=4.0).guess(np.array(seq), 8)
    want, want_expected = brute(kept, seq, 8, 32, 0.05, 4.0)
    assert tokens == want and expected == pytest.approx(want_expected)


def test_a_stream_used_by_a_guess_outlives_older_unused_ones():
    store = SuffixStore(max_tokens=12)
    proposer = SuffixProposer(4, store=store)
    proposer.finish([1, 2, 3, 4])  # oldest
    proposer.finish([5, 6, 7, 8])
    assert proposer.guess(np.array([9, 1, 2]), 4)[0] == [3, 4]  # uses the oldest stream
    proposer.finish([10, 11, 12, 13])  # 12 tokens: fits
    proposer.finish([14, 15, 16, 17])  # evicts the least recently used: [5..8], not [1..4]
    assert store.tokens == 12
    assert proposer.guess(np.array([0, 1, 2]), 4)[0] == [3, 4]
    assert proposer.guess(np.array([0, 5, 6]), 4)[0] == []


def test_memory_is_bounded_by_its_tokens():
    store = SuffixStore(max_tokens=50_000)
    rng = np.random.default_rng(0)
    for _ in range(40):
        store.add(rng.integers(0, 50_000, 5_000))
    store.occurrences(7)  # builds the index
    held = sum(a.nbytes for a in store._index()) + sum(s.nbytes for s in store._streams.values())
    assert store.tokens <= 50_000
    assert held <= 32 * 50_000  # about 28 bytes a token: the streams, the buffer, the sorted index


def test_bad_arguments_say_what_to_do():
    with pytest.raises(SpecdecError, match="max_tokens"):
        SuffixStore(0)
    with pytest.raises(SpecdecError, match="floor"):
        SuffixProposer(4, floor=0.0)
    with pytest.raises(SpecdecError, match="non-negative"):
        SuffixStore().add([1, -2])


def test_method_specs_build_the_memory_and_its_hybrid(models):
    # this module's own pair: conftest's session `draft` must be made before its `target` runs
    # anywhere, which another test on the same worker may already have done
    from specdec.methods.build import Drafts

    assert isinstance(build_proposer(parse("suffix:k=8")), SuffixProposer)
    hybrid = build_proposer(parse("suffix+draft:k=2"), Drafts(models[1]))
    assert isinstance(hybrid, SuffixHybrid) and hybrid.memory.k == 8 and hybrid.draft.k == 2 and hybrid.k == 8
    with pytest.raises(SpecdecError, match="ngram"):
        parse("suffix:ngram=3")


@pytest.fixture(scope="module")
def models():
    target = tiny_model(300)
    return target, perturbed(target, seed=3, scale=0.4)


def two_requests(target, proposer, k_prompt: int = 12):
    """Request 1 from a random prompt; request 2 the same prompt again (its output repeats the
    first's): each compared with plain decoding."""
    prompt = torch.randint(0, 64, (k_prompt,), generator=torch.Generator().manual_seed(5))
    plain = generate(target, prompt, max_new_tokens=48, eos_token_id=[]).new_tokens
    outs = []
    for _ in range(2):
        out = generate(target, prompt, drafter=proposer, max_new_tokens=48, eos_token_id=[], check=True)
        assert out.new_tokens == plain
        outs.append(out)
    # generate told the proposer how each request ended (Decoding.result -> Proposer.finish), once
    memory = proposer.memory if isinstance(proposer, SuffixHybrid) else proposer
    assert memory.store.tokens == 2 * (k_prompt + 48)
    return outs


@pytest.mark.parametrize("k", [1, 3, 8])
def test_suffix_greedy_equals_plain_and_repeats_are_guessed(models, k):
    target, _ = models
    first, second = two_requests(target, SuffixProposer(k))
    # The second request's output is in memory: nearly every round guesses k and all are
    # accepted (47 tokens after the prefill's: each round commits its accepted guesses and one).
    assert second.stats.rounds <= math.ceil(47 / (k + 1)) + 2
    assert second.stats.accepted == 47 - second.stats.rounds > first.stats.accepted


def test_suffix_hybrid_greedy_equals_plain_and_repeats_come_from_memory(models):
    target, draft = models
    hybrid = SuffixHybrid(DraftModel(draft, 2), SuffixProposer(8))
    first, second = two_requests(target, hybrid)
    assert first.stats.draft_calls > 0
    assert second.stats.rounds <= math.ceil(47 / 9) + 3 < first.stats.rounds
    assert hybrid.draft_rounds <= 2


def test_forks_share_the_memory_in_a_batch(models):
    target, draft = models
    hybrid = SuffixHybrid(DraftModel(draft, 2), SuffixProposer(6))
    prompts = [torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(s)).tolist() for s in (1, 2)]
    plain = [generate(target, p, max_new_tokens=30, eos_token_id=[]).new_tokens for p in prompts]
    outs = generate(target, prompts, drafter=hybrid, max_new_tokens=30, eos_token_id=[], check=True)
    assert [o.new_tokens for o in outs] == plain
    # Each sequence's fork learned it when it ended: the root and every fork know both
    assert hybrid.memory.store.tokens == 2 * 40
    assert hybrid.fork().memory.guess(np.array(prompts[0]), 6)[0] == plain[0][:6]


def with_memory(k: int) -> SuffixProposer:
    """A memory that has seen the prompt continued three ways (shares 1/2, 1/4, 1/4)."""
    proposer = SuffixProposer(k, floor=0.2, factor=4.0)
    for tail in ([1, 2, 3, 4], [1, 2, 5, 6], [3, 3, 3, 3], [1, 2, 3, 4]):
        proposer.finish(PROMPT + tail)
    return proposer


def test_suffix_sampling_matches_target():
    target, _ = make_pair(5)
    ps = pvalues(target, with_memory(3), CONFIGS["plain"])
    assert min(ps) > PASS, ps


def test_suffix_hybrid_sampling_matches_target():
    target, draft = make_pair(6)
    hybrid = SuffixHybrid(DraftModel(draft, 2), with_memory(3))
    # The first round's guesses come from memory (expected 0.75 + 0.75 + 0.5 >= the draft's k);
    # after a 1 and a 2 the memory expects 2/3 + 2/3 only: the draft guesses.
    assert hybrid.memory.guess(np.array(PROMPT), 3) == ([1, 2, 3], pytest.approx(2.0))
    assert hybrid.memory.guess(np.array(PROMPT + [1, 2]), 3)[1] == pytest.approx(4 / 3)
    ps = pvalues(target, hybrid, CONFIGS["top_p"])
    assert min(ps) > PASS, ps


def test_sampling_tests_see_memory_and_draft_rounds_accepted_and_rejected():
    """The two tests above are not vacuous: memory guesses are made, some rejected, and the
    hybrid's rounds come from both parts."""
    target, draft = make_pair(6)
    hybrid = SuffixHybrid(DraftModel(draft, 2), with_memory(3))
    memory_rounds = draft_rounds = accepted = proposed = 0
    for seed in range(40):
        out = generate(target, PROMPT, drafter=hybrid, max_new_tokens=5, temperature=1.0, seed=seed, eos_token_id=[])
        memory_rounds += sum(1 for n in out.stats.proposed_lengths if n) - hybrid.draft_rounds
        draft_rounds += hybrid.draft_rounds
        accepted, proposed = accepted + out.stats.accepted, proposed + out.stats.proposed
    assert memory_rounds > 10 and draft_rounds > 10
    assert 0 < accepted < proposed


def test_both_are_proposers_and_so_are_their_forks(models):
    from specdec.decode.proposal import Proposer

    _, draft = models
    for proposer in (SuffixProposer(4), SuffixHybrid(DraftModel(draft, 2), SuffixProposer(8))):
        assert isinstance(proposer, Proposer) and isinstance(proposer.fork(32), Proposer)
        assert proposer.fork(32).draft_lm is not proposer.draft_lm or proposer.draft_lm is None


def test_the_server_remembers_what_it_answered(tmp_path):
    """`specdec serve --proposer suffix:k=8` on the tiny GGUF pair: the server builds its proposer
    once and forks it per request, and every finished request teaches the shared memory, so the
    same request sent again is guessed from its first answer (nearly every guess accepted), with
    the same text."""
    from serve_native import start_native, stop

    served = start_native(tmp_path, "--proposer", "suffix:k=8", "--no-plan")
    try:
        body = {"model": served.name, "prompt": [5, 9, 14, 3, 7, 22], "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}
        first, second = (httpx.post(f"{served.url}/v1/completions", json=body, timeout=60).json() for _ in range(2))
    finally:
        stop(served)
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    accepted = [reply["timings"]["draft_n_accepted"] for reply in (first, second)]
    assert accepted[1] >= 30 > accepted[0], accepted
