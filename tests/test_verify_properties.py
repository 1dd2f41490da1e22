"""Property tests of the verifier on random logits, drafts and distributions (k 1..16)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.decode.sampling import SamplingConfig, probs
from specdec.decode.verify import verify_greedy, verify_sampling

V = 12


@st.composite
def blocks(draw):
    k = draw(st.integers(1, 16))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(k + 1, V, generator=gen) * draw(st.sampled_from([0.5, 3.0, 10.0]))
    # Drafts that agree with the rows' argmax for a random prefix, then anything.
    agree = draw(st.integers(0, k))
    draft = torch.randint(0, V, (k,), generator=gen)
    draft[:agree] = rows[:agree].argmax(-1)
    return rows, draft, gen


@settings(max_examples=200, deadline=None)
@given(blocks())
def test_greedy_takes_the_longest_agreeing_prefix_then_the_targets_token(block):
    rows, draft, _ = block
    v = verify_greedy(rows, draft)
    choice = rows.argmax(-1)
    n = 0
    while n < draft.numel() and draft[n] == choice[n]:
        n += 1
    assert v.accepted == n
    assert v.next_token.item() == choice[n].item()


@settings(max_examples=200, deadline=None)
@given(blocks(), st.sampled_from([None, 2, 5]), st.sampled_from([None, 0.5, 0.9]))
def test_sampling_never_commits_a_zero_probability_token(block, top_k, top_p):
    rows, draft, gen = block
    cfg = SamplingConfig(1.0, top_k, top_p)
    p = probs(rows, cfg)
    q = probs(rows.roll(1, dims=-1) + torch.randn(rows.shape, generator=gen), cfg)[:-1]
    draft = torch.stack([torch.multinomial(row, 1, generator=gen)[0] for row in q])
    for proposal_q in (q, None):  # a draft model, and a deterministic proposer
        v = verify_sampling(rows, draft, proposal_q, cfg, gen)
        committed = torch.cat([draft[: v.accepted], v.next_token])
        assert 0 <= v.accepted <= draft.numel()
        assert all(p[i, t] > 0 for i, t in enumerate(committed.tolist()))


@settings(max_examples=100, deadline=None)
@given(blocks())
def test_sampling_accepts_everything_when_q_equals_p(block):
    rows, _, gen = block
    cfg = SamplingConfig(1.0)
    p = probs(rows, cfg)
    draft = torch.stack([torch.multinomial(row, 1, generator=gen)[0] for row in p[:-1]])
    assert verify_sampling(rows, draft, p[:-1], cfg, gen).accepted == draft.numel()
