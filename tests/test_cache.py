"""The cache adapter: append, trim, and trim-then-append against a fresh prefill."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.runtime.hf.causal_lm import CausalLM


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
        assert lm.cache.layer_lengths() == [len(tokens)] * target.config.num_hidden_layers
    if last is not None:
        torch.testing.assert_close(last, fresh_logits(target, tokens)[-1], rtol=1e-4, atol=1e-4)


# --- the preallocated layout (cache.PreallocatedLayer) against transformers' DynamicLayer ----

@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 63), min_size=1, max_size=6)),
    st.tuples(st.just("trim"), st.integers(0, 30)),
), min_size=1, max_size=14), headroom=st.sampled_from([1, 4, 256]))
def test_preallocated_layout_gives_bitwise_the_dynamic_logits(target, ops, headroom):
    """Same numbers, not merely close: attention reads views of the same values. A small
    headroom makes the buffers grow (and copy) often."""
    from specdec.runtime.hf.kv_cache import PreallocatedLayer

    PreallocatedLayer.HEADROOM, saved = headroom, PreallocatedLayer.HEADROOM
    try:
        layouts = [CausalLM(target, preallocate=True), CausalLM(target, preallocate=False)]
        for op, arg in ops:
            if op == "append":
                rows = [lm.forward(torch.tensor(arg)) for lm in layouts]
                assert torch.equal(rows[0], rows[1])
            else:
                for lm in layouts:
                    lm.cache.trim(min(arg, lm.length))
            assert layouts[0].length == layouts[1].length
            for lm in layouts:
                assert lm.cache.layer_lengths() == [layouts[1].length] * target.config.num_hidden_layers
    finally:
        PreallocatedLayer.HEADROOM = saved


def test_preallocated_layers_are_preallocated_and_written_in_place(target):
    """After a prefill, appends and trims within the reserved room reuse one buffer per layer:
    no copy of the cache per forward (what the layout is for)."""
    from specdec.runtime.hf.kv_cache import PreallocatedLayer

    lm = CausalLM(target)
    assert all(type(layer) is PreallocatedLayer for layer in lm.cache.hf_cache.layers)
    lm.prefill(torch.arange(10))
    storages = [layer.keys.untyped_storage().data_ptr() for layer in lm.cache.hf_cache.layers]
    for _ in range(20):
        lm.forward(torch.tensor([1, 2, 3]))
        lm.cache.trim(lm.length - 2)
    assert lm.length == 10 + 20
    assert [layer.keys.untyped_storage().data_ptr() for layer in lm.cache.hf_cache.layers] == storages
    assert all(layer.capacity == 10 + PreallocatedLayer.HEADROOM for layer in lm.cache.hf_cache.layers)


def test_dynamic_layout_is_still_transformers_own(target):
    from transformers.cache_utils import DynamicLayer

    lm = CausalLM(target, preallocate=False)
    assert all(type(layer) is DynamicLayer for layer in lm.cache.hf_cache.layers)


def test_long_prompts_are_prefilled_in_blocks(target, monkeypatch):
    """A prompt over PREFILL_CHUNK tokens goes in blocks of that size; the cache then holds the
    whole prompt and the last row matches a one-block prefill (up to float rounding)."""
    import specdec.runtime.hf.causal_lm

    prompt = torch.arange(11) % 64
    whole = CausalLM(target).prefill(prompt)
    monkeypatch.setattr(specdec.runtime.hf.causal_lm, "PREFILL_CHUNK", 4)
    lm = CausalLM(target)
    last = lm.prefill(prompt)
    assert lm.calls == 3 and lm.length == 11
    assert torch.equal(lm._held[: lm.length], prompt)
    torch.testing.assert_close(last, whole, rtol=1e-5, atol=1e-5)
    # reuse: the kept prefix plus the rest, in blocks again
    longer = torch.cat([prompt, torch.arange(9)])
    last = lm.prefill(longer, reuse=True)
    assert lm.calls == 3 and lm.length == 20  # 11 kept, then 4 + 4 + 1
    torch.testing.assert_close(last, CausalLM(target).prefill(longer), rtol=1e-5, atol=1e-5)
