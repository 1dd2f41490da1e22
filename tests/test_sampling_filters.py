"""top-k, top-p and min-p without sorting the vocabulary give the masks the full sort gives.

The reference is the implementation specdec had before (a sort of every row), kept here only,
with one change: its sort is stable. torch.sort(descending=True) on the CPU is not stable for
rows of 1000 tokens or more, so which of several tokens tied at the nucleus's boundary it kept
was up to the sort's algorithm; the rule is now the stable sort's: ties by token id ascending.
min-p has no old implementation: the reference applies llama.cpp's test after the others.

Floating point: the reference sums softmax's float32 normaliser in sorted order, the new code
in vocabulary order. Where that sum is exact (flat rows, ties, peaked rows whose tail
underflows) the masks must be equal bit for bit; on random rows a token may differ only if
its mass before it lies within rounding of top_p (checked in float64, band below).
"""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from specdec import SpecdecError, generate
from specdec.cli import main
from specdec.decode.sampling import SamplingConfig, filtered, probs

V = 151936  # Qwen2.5's vocabulary
BAND = 5e-5  # |mass before - top_p| within which the two normalisers may disagree


def reference(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The old full-sort transform (logits already divided by the temperature), min-p added."""
    if cfg.top_k is not None and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if cfg.min_p:
        floor = logits.amax(-1, keepdim=True) + math.log(cfg.min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    return logits


def exact_mass_before(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Per token, the mass before it in the stable order, in float64 (after top-k)."""
    if cfg.top_k is not None and cfg.top_k < logits.shape[-1]:
        logits = reference(logits, SamplingConfig(1.0, top_k=cfg.top_k))
    sorted_logits, order = torch.sort(logits.double(), dim=-1, descending=True, stable=True)
    p = torch.softmax(sorted_logits, dim=-1)
    return torch.zeros_like(p).scatter(-1, order, p.cumsum(-1) - p)


def assert_same(logits: torch.Tensor, cfg: SamplingConfig, band: float = 0.0) -> int:
    """The new mask equals the reference's; with band > 0, tokens whose mass before them lies
    within band of top_p may differ. Returns how many did."""
    new, old = filtered(logits, cfg), reference(logits, cfg)
    assert new.shape == old.shape and new.dtype == old.dtype
    differ = torch.isinf(new) != torch.isinf(old)
    if not differ.any():
        assert torch.equal(new, old)
        return 0
    assert band > 0, f"{int(differ.sum())} tokens differ for {cfg}"
    assert cfg.top_p is not None
    near = (exact_mass_before(logits, cfg) - cfg.top_p).abs() <= band
    assert near[differ].all(), f"a token away from the boundary differs for {cfg}"
    return int(differ.sum())


CONFIGS = [SamplingConfig(1.0, top_k, top_p, min_p)
           for top_k in (None, 1, 3, 40)
           for top_p in (None, 1e-6, 0.05, 0.5, 0.9, 0.95, 0.999, 1.0)
           for min_p in (0.0, 0.05, 0.5)]


def tied_row(width: int, gen: torch.Generator) -> torch.Tensor:
    """Four tokens on top, then 12 tied at logit 0 scattered over the vocabulary, then a tail
    that underflows: the boundary of most top_p values falls inside the tie."""
    row = torch.full((width,), -200.0)
    ids = torch.randperm(width, generator=gen)[:16]
    row[ids[:4]] = torch.tensor([3.0, 2.0, 2.0, 1.0])
    row[ids[4:]] = 0.0
    return row


def adversarial_rows(width: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(width)
    peaked = torch.randn(width, generator=gen) * 0.5
    peaked[int(torch.randint(width, (1,), generator=gen))] = 120.0
    two_peaks = torch.full((width,), -300.0)
    two_peaks[[width // 3, width // 2]] = 50.0  # a tie on top: top_p < 0.5 keeps the lower id
    masked = tied_row(width, gen)
    masked[torch.arange(0, width, 3)] = float("-inf")  # a head that scores some ids only
    return {
        "flat": torch.zeros(width),
        "ties": tied_row(width, gen),
        "tied pairs": torch.arange(width).div(2, rounding_mode="floor").float().neg() * 0.5,
        "peaked": peaked,
        "two peaks": two_peaks,
        "masked": masked,
    }


@pytest.mark.parametrize("width", [8, 1000, V])
def test_adversarial_rows_give_the_full_sorts_masks(width):
    rows = adversarial_rows(width)
    configs = CONFIGS if width < V else [  # fewer at full width: the reference sorts 15 ms a row
        c for c in CONFIGS if c.top_k in (None, 3) and c.top_p in (None, 1e-6, 0.5, 0.95, 1.0) and c.min_p < 0.5]
    for name, row in rows.items():
        for cfg in configs:
            assert_same(row, cfg), name


def test_ties_keep_the_lowest_ids():
    """The tie rule itself, on a row where it decides: 10 tokens tied, the nucleus needs 3."""
    row = torch.full((V,), -200.0)
    ids = torch.tensor([150000, 7, 99999, 12, 5000, 42, 151935, 0, 77, 31337])
    row[ids] = 1.0
    kept = torch.isfinite(filtered(row, SamplingConfig(1.0, top_p=0.25))).nonzero().flatten()
    assert kept.tolist() == sorted(ids.tolist())[:3]


def test_batches_and_shapes():
    """Rows of different nuclei batched together, in 2-D and 3-D, equal row by row."""
    gen = torch.Generator().manual_seed(1)
    rows = torch.stack([torch.randn(1000, generator=gen) * s for s in (0.1, 1.0, 3.0, 10.0, 30.0, 100.0)])
    cfg = SamplingConfig(1.0, top_p=0.9, min_p=0.01)
    whole = filtered(rows, cfg)
    assert torch.equal(filtered(rows.view(2, 3, -1), cfg), whole.view(2, 3, -1))
    for i in range(rows.shape[0]):
        assert torch.equal(filtered(rows[i], cfg), whole[i])


def test_random_rows():
    """400 random rows of 1000 tokens and 4 of 151,936 at several scales and filters: equal,
    but for tokens within BAND of top_p (counted: a handful at most)."""
    gen = torch.Generator().manual_seed(0)
    differ = 0
    scales = torch.tensor([1.0, 3.0, 10.0, 30.0]).view(4, 1)
    for width, batches in ((1000, 100), (V, 1)):
        for _ in range(batches):
            rows = torch.randn(4, width, generator=gen) * scales
            for cfg in (SamplingConfig(1.0, None, 0.95), SamplingConfig(1.0, None, 0.9, 0.05),
                        SamplingConfig(1.0, 40, 0.95), SamplingConfig(1.0, None, 0.5, 0.2)):
                differ += assert_same(rows, cfg, band=BAND)
    print("tokens within the band that differ:", differ)
    assert differ <= 20, differ


class Sizes(TorchFunctionMode):
    """The widest row handed to a sort, and the largest k asked of a top-k."""

    def __init__(self):
        super().__init__()
        self.widest = self.k = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("sort", "argsort", "msort", "kthvalue"):
            self.widest = max(self.widest, args[0].shape[-1] if args[0].dim() else 1)
        if name == "topk":
            self.k = max(self.k, args[1])
        return func(*args, **(kwargs or {}))


def test_top_p_does_not_sort_the_vocabulary():
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(4, V, generator=gen) * 2
    rows[:, :5] += torch.tensor([25.0, 24.0, 23.0, 20.0, 18.0])  # peaked, as a model's rows mostly are
    for cfg in (SamplingConfig(0.8, top_p=0.95), SamplingConfig(0.8, top_p=0.95, min_p=0.05),
                SamplingConfig(0.8, top_k=40, top_p=0.95)):
        sizes = Sizes()
        with sizes:
            probs(rows, cfg)
        assert sizes.widest < 5000 and sizes.k <= 40, (cfg, sizes.widest, sizes.k)


def test_probs_is_the_softmax_of_the_filtered_logits():
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(3, 500, generator=gen) * 4
    cfg = SamplingConfig(0.7, top_k=50, top_p=0.9, min_p=0.05)
    p = probs(rows, cfg)
    assert torch.equal(p, torch.softmax(reference(rows / 0.7, cfg), -1))
    assert torch.allclose(p.sum(-1), torch.ones(3))


def test_min_p_alone_and_its_validation():
    row = torch.log(torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04]))
    kept = torch.isfinite(filtered(row, SamplingConfig(1.0, min_p=0.15))).tolist()
    assert kept == [True, True, True, False, False]  # 0.06 < 0.15 * 0.5 = 0.075 <= 0.1
    assert torch.equal(filtered(row, SamplingConfig(1.0, min_p=None)), row)
    for bad in (-0.1, 1.0, 2.0, float("nan")):
        with pytest.raises(SpecdecError, match=r"min_p must be in \[0, 1\)"):
            SamplingConfig(1.0, min_p=bad)


def test_generate_takes_min_p(target):
    common = {"max_new_tokens": 6, "temperature": 1.0, "seed": 4, "eos_token_id": []}
    out = generate(target, [1, 2, 3], min_p=0.999999, **common)  # only the top token survives
    greedy = generate(target, [1, 2, 3], max_new_tokens=6, eos_token_id=[])
    assert out.new_tokens == greedy.new_tokens
    with pytest.raises(SpecdecError, match="min_p"):
        generate(target, [1, 2], min_p=1.5, **common)


def test_cli_min_p_is_checked(capsys):
    for bad in ("1", "-0.5", "x"):
        with pytest.raises(SystemExit) as stop:
            main(["generate", "--target", "tiny", "--prompt", "hi", "--min-p", bad])
        assert stop.value.code == 2
        assert "--min-p: must be a number in [0, 1)" in capsys.readouterr().err


def test_a_vanishing_temperature_is_greedy(target):
    """T = 1e-300 divides float32 logits to inf/NaN, whose draw is the vocabulary's last id: below
    GREEDY_BELOW a temperature decodes greedily (vLLM's rule), so its tokens are greedy's."""
    assert SamplingConfig(1e-300).greedy and SamplingConfig(9e-6).greedy and not SamplingConfig(1e-5).greedy
    greedy = generate(target, [1, 2, 3], max_new_tokens=8, eos_token_id=[])
    for t in (1e-300, 9e-6):
        out = generate(target, [1, 2, 3], max_new_tokens=8, temperature=t, seed=3, eos_token_id=[])
        assert out.new_tokens == greedy.new_tokens
