"""The cache adapter: append, trim, and trim-then-append against a fresh prefill."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.lm import CausalLM


def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    lm = CausalLM(model)
    return lm.forward(torch.tensor(tokens))


def test_append_adds_one_position_per_token(target):
    lm = CausalLM(target)
    lm.forward(torch.tensor([1, 2, 3]))
    assert lm.length == 3
    for n, token in enumerate([4, 5, 6], start=4):
        lm.forward(torch.tensor([token]))
        assert lm.length == n
        assert lm.cache.layer_lengths() == [n] * target.config.num_hidden_layers


@pytest.mark.parametrize("keep", range(0, 9))
def test_trim_to_every_legal_length_keeps_layers_consistent(target, keep):
    lm = CausalLM(target)
    lm.forward(torch.arange(8))
    lm.cache.trim(keep)
    assert lm.length == keep
    assert lm.cache.layer_lengths() == [keep] * target.config.num_hidden_layers


def test_trim_beyond_length_is_refused(target):
    lm = CausalLM(target)
    lm.forward(torch.arange(4))
    with pytest.raises(ValueError):
        lm.cache.trim(5)
    with pytest.raises(ValueError):
        lm.cache.trim(-1)


def test_trim_then_append_equals_fresh_prefill(target):
    lm = CausalLM(target)
    lm.forward(torch.tensor([5, 9, 11, 13, 2, 7]))
    lm.cache.trim(3)
    rows = lm.forward(torch.tensor([40, 41]))
    expected = fresh_logits(target, [5, 9, 11, 40, 41])[-2:]
    torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 63), min_size=1, max_size=5)),
    st.tuples(st.just("trim"), st.integers(0, 30)),
), min_size=1, max_size=12))
def test_random_append_trim_matches_a_plain_list(target, ops):
    """The cache behaves like a list of tokens: after any append/trim sequence its last
    logits equal a fresh prefill of the list's contents."""
    lm, tokens, last = CausalLM(target), [], None
    for op, arg in ops:
        if op == "append":
            last = lm.forward(torch.tensor(arg))[-1]
            tokens += arg
        else:
            keep = min(arg, len(tokens))
            lm.cache.trim(keep)
            tokens, last = tokens[:keep], None
        assert lm.length == len(tokens)
        assert set(lm.cache.layer_lengths()) <= {len(tokens)}
    if last is not None:
        torch.testing.assert_close(last, fresh_logits(target, tokens)[-1], rtol=1e-4, atol=1e-4)
