"""The restricted draft head: which ids it keeps, and that it scores them as the full head does."""

import copy

import pytest
import torch
from conftest import tiny_model, word_tokenizer

from specdec import DraftModel
from specdec.errors import SpecdecError
from specdec.models.draft_head import bundled_text_tokens, frequent_tokens, restrict_head
from specdec.runtime.hf.model_facts import HEAD_IDS
from specdec.models.draft_quant import int8_draft


def test_frequent_tokens_order():
    texts = [[5, 5, 5, 2, 2, 9], [9, 2, 7]]  # counts: 5:3, 2:3, 9:2, 7:1
    assert frequent_tokens(texts, 3, 10).tolist() == [2, 5, 9]  # ties broken by id
    assert frequent_tokens(texts, 2, 10, always=[8]).tolist() == [2, 8]
    # unseen ids fill up in increasing order
    assert frequent_tokens(texts, 6, 10).tolist() == [0, 1, 2, 5, 7, 9]
    assert frequent_tokens([[3, 99]], 2, 10).tolist() == [0, 3]  # ids outside the vocabulary ignored
    with pytest.raises(SpecdecError, match="must lie in"):
        frequent_tokens(texts, 11, 10)


def test_a_tokenizers_frequent_head_ids_are_counted_once_and_kept(monkeypatch, tmp_path):
    """The second start reads the ids the first counted (the same ids, no prompt tokenized); another
    size is counted anew, and a tokenizer that names no source is never kept."""
    import specdec.files
    from specdec.models import draft_head

    monkeypatch.setattr(specdec.files, "cache_root", lambda: tmp_path)
    tokenizer = word_tokenizer(64)
    tokenizer.name_or_path = "words-64"
    first = draft_head.frequent_head_ids(tokenizer, 16, 64)
    assert len(list((tmp_path / "head-ids").iterdir())) == 1
    counted = []
    monkeypatch.setattr(draft_head, "bundled_text_tokens", lambda t: counted.append(1) or [[5, 5, 9]])
    assert torch.equal(draft_head.frequent_head_ids(tokenizer, 16, 64), first) and not counted
    assert draft_head.frequent_head_ids(tokenizer, 8, 64).tolist() == [0, 1, 2, 3, 4, 5, 6, 9] and counted
    nameless = word_tokenizer(64)
    draft_head.frequent_head_ids(nameless, 8, 64)
    assert len(list((tmp_path / "head-ids").iterdir())) == 2 and len(counted) == 2


def test_restricted_head_scores_kept_ids_like_the_full_head():
    model = tiny_model(3)
    keep = torch.tensor([40, 3, 17, 63, 0])
    small = restrict_head(copy.deepcopy(model), keep)
    assert getattr(small, HEAD_IDS).tolist() == [0, 3, 17, 40, 63]
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        full = model(input_ids=ids).logits[0, -1]
        part = small(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(part, full[getattr(small, HEAD_IDS)])
    # the proposer spreads them back over the vocabulary, -inf elsewhere
    drafter = DraftModel(small, 2)
    drafter.begin(ids[0, :-1], 64)
    logits = drafter.spread(drafter.lm.forward(ids[0, -1:], last_only=True)[-1])
    assert logits.shape == (64,) and torch.isinf(logits).sum() == 59
    torch.testing.assert_close(logits[keep], full[keep], atol=1e-4, rtol=1e-4)


def test_restrict_head_refuses_bad_input():
    model = tiny_model(3)
    with pytest.raises(SpecdecError, match=r"\[0, 64\)"):
        restrict_head(copy.deepcopy(model), torch.tensor([64]))
    with pytest.raises(SpecdecError, match="before quantizing"):
        restrict_head(int8_draft(copy.deepcopy(model)), torch.tensor([1]))
    twice = restrict_head(copy.deepcopy(model), torch.tensor([1, 2]))
    with pytest.raises(SpecdecError, match="already restricted"):
        restrict_head(twice, torch.tensor([1]))
    # a draft whose head names ids the target lacks is refused when a sequence starts
    with pytest.raises(SpecdecError, match="the target does not have"):
        DraftModel(restrict_head(copy.deepcopy(model), torch.tensor([50])), 2).begin(torch.tensor([1]), 32)


def test_bundled_text_is_real_text():
    tokens = bundled_text_tokens(word_tokenizer(64))
    assert len(tokens) == 480 and sum(map(len, tokens)) > 10_000


FILTERS = [dict(temperature=0.8), dict(temperature=0.8, top_k=5), dict(temperature=0.8, top_p=0.9),
           dict(temperature=0.8, top_p=0.95, min_p=0.05), dict(temperature=1.3, top_k=7, top_p=0.5, min_p=0.2)]


@pytest.mark.parametrize("filters", FILTERS)
def test_guessing_over_the_head_columns_is_guessing_over_the_spread_row(filters):
    """The draft guesses over its restricted head's columns; the q it hands the verifier, spread
    back over the vocabulary, is the q of the spread row, and its token is a head id."""
    from specdec.decode.sampling import SamplingConfig, probs
    from specdec.proposers.draft import guess

    gen = torch.Generator().manual_seed(0)
    ids = torch.sort(torch.randperm(64, generator=gen)[:20]).values
    cfg = SamplingConfig(**filters)
    for trial in range(20):
        row = torch.randn(20, generator=gen) * 3
        row[3] = row[11]  # a tie inside the head
        spread = torch.full((64,), float("-inf")).index_copy_(0, ids, row)
        qs: list[torch.Tensor] = []
        token = guess(row, cfg, torch.Generator().manual_seed(trial), qs, ids, 64)
        torch.testing.assert_close(qs[0], probs(spread, cfg), rtol=1e-6, atol=1e-7)
        assert int(token) in ids.tolist() and qs[0][token] > 0
        assert qs[0][~torch.isin(torch.arange(64), ids)].eq(0).all()
    greedy = SamplingConfig(temperature=0.0)
    row = torch.randn(20, generator=gen)
    row[7] = row[2] = row.max() + 1  # a tie for the largest: the lower id, as over the full row
    spread = torch.full((64,), float("-inf")).index_copy_(0, ids, row)
    assert guess(row, greedy, None, [], ids, 64).tolist() == guess(spread, greedy, None, []).tolist() == [int(ids[2])]
