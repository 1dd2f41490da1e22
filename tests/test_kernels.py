"""specdec's quantized kernels (specdec.kernels, qgemm.cpp) and weight formats (quant.weights).

What must hold, each checked without tolerance where the design promises bits:
- the product is x_q W^T, x_q the activations quantized per row in blocks of 32 (computed here
  by torch in float64 from the same int8 values): relative error < 1e-5 of the output's scale;
- a row's output is the same bits alone, inside any block of 1..17 rows at any position, with
  1 or 2 threads, and (where the CPU runs it) on the AVX-512 VNNI path, its AMX tiles (blocks
  of 9-16 rows) and the portable path;
- GGUF's Q4_K, Q4_1 and Q6_K blocks decode to the same floats as gguf-py's own dequantization;
- rounding a float weight stays within stated error (Q4 groups of 32: < 10% relative Frobenius
  error on Gaussian weights, Q8: < 1%, Q3: < 20% and below plain min-max rounding's);
- a failed build reports the compiler's error and leaves no library behind.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specdec import kernels
from specdec.errors import SpecdecError
from specdec.quant.gguf_blocks import (q4k_split, q5k_split, q6k_split, q40_split, q41_split, q50_split, q51_split,
                                       q80_split)
from specdec.quant.weights import Q8Weight, _affine, q3_rtn, q4_rtn, q8_rtn

SHAPES = [(16, 32), (48, 96), (64, 896), (256, 1536), (32, 8960)]  # 896, 96: a short last super-block


def activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels quantize it, in float64: per row and block of 32, round(x * 127/amax)
    (a true division: torch's scalar / tensor multiplies by a reciprocal, which rounds apart)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv).clamp(-127, 127)
    return (q.double() * (amax.double() / 127)).reshape(x.shape)


def weight(kind: str, out: int, inputs: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(out, inputs, generator=gen) * 0.05
    if kind == "q6":  # Q6_K's form: codes below 64 around the zero 32 (stored in 6 bits)
        w = q8_rtn(dense)
        return Q8Weight((w.codes.int() - 128).clamp(-32, 31).add(32).to(torch.uint8), w.sub_scales, w.scales, 32)
    return {"q3": q3_rtn, "q4": q4_rtn, "q8": q8_rtn}[kind](dense)


@pytest.mark.parametrize("kind", ["q3", "q4", "q6", "q8"])
@pytest.mark.parametrize("out, inputs", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_product_is_that_of_the_quantized_activations(kind, out, inputs, dtype):
    w = weight(kind, out, inputs)
    x = torch.randn(5, inputs).to(dtype)
    bias = torch.randn(out)
    y = kernels.linear(x, kernels.pack(w), bias, torch.float32)
    expected = activations(x) @ w.dequantize().double().T + bias.double()
    assert (y.double() - expected).abs().max() < 1e-5 * expected.abs().max()
    # bfloat16 output is the float32 result rounded once
    assert torch.equal(kernels.linear(x, kernels.pack(w), bias, torch.bfloat16), y.bfloat16())


@pytest.mark.parametrize("kind", ["q3", "q4", "q6", "q8"])
@pytest.mark.parametrize("out, inputs", SHAPES)
def test_a_rows_bits_do_not_depend_on_its_block_threads_or_path(kind, out, inputs):
    packed = kernels.pack(weight(kind, out, inputs, seed=1))
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(17, inputs, generator=gen) * torch.exp2(torch.randint(-6, 7, (17, inputs), generator=gen))
         ).bfloat16()
    full = kernels.linear(x, packed, None, torch.bfloat16)
    for rows in range(1, 17):
        for at in (0, 17 - rows):
            assert torch.equal(kernels.linear(x[at : at + rows], packed, None, torch.bfloat16), full[at : at + rows])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernels.linear(x, packed, None, torch.bfloat16), full)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(kernels.linear(x, packed, None, torch.bfloat16, portable=True), full)


@pytest.mark.parametrize("kind", ["q3", "q4", "q6", "q8"])
def test_rows_of_a_long_block_keep_their_bits(kind):
    """Past 16 rows the quantized activations lie in panels of 16 rows (qgemm.cpp's Acts) and the
    VNNI path takes 16 rows at a time: a row keeps its bits in any panel, chunk and path."""
    out, inputs = SHAPES[2]
    packed = kernels.pack(weight(kind, out, inputs, seed=5))
    x = torch.randn(101, inputs, generator=torch.Generator().manual_seed(6))
    full = kernels.linear(x, packed, None, torch.float32)
    for at, rows in ((0, 1), (15, 1), (16, 1), (100, 1), (3, 50), (40, 61), (0, 64), (47, 54), (9, 20)):
        assert torch.equal(kernels.linear(x[at : at + rows], packed, None, torch.float32), full[at : at + rows])
    assert torch.equal(kernels.linear(x, packed, None, torch.float32, portable=True), full)
    if HAS_AVX2:
        assert torch.equal(kernels.linear(x, packed, None, torch.float32, march="x86-64-v3"), full)


def test_q6_codes_take_three_quarters_of_q8s_bytes_and_give_its_bits():
    """Q6_K's codes stored in 6 bits (kernels.pack's Q6) compute what the same codes in 8 give."""
    w = weight("q6", 64, 1536, seed=7)
    assert w.bits == 6 and int(w.codes.max()) == 63 and int(w.codes.min()) == 0
    as8 = Q8Weight(w.codes, w.sub_scales, w.scales, w.zero)
    as8.__dict__["bits"] = 8  # the 8-bit layout of the same codes
    six, eight = kernels.pack(w), kernels.pack(as8)
    assert (six.bits, eight.bits) == (6, 8) and six.codes.numel() * 4 == eight.codes.numel() * 3
    x = torch.randn(19, 1536) * 4
    marches = ["native", "x86-64", *(["x86-64-v3"] if HAS_AVX2 else [])]
    for march in marches:
        for rows in (1, 8, 19):
            assert torch.equal(kernels.linear(x[:rows], six, None, torch.float32, march=march),
                               kernels.linear(x[:rows], eight, None, torch.float32))


FLAGS = open("/proc/cpuinfo").read().split()
HAS_AVX2 = all(f in FLAGS for f in ("avx2", "fma"))


def test_the_vector_path_is_the_widest_the_cpu_has():
    expected = ("avx512-vnni" if all(f in FLAGS for f in ("avx512f", "avx512bw", "avx512_vnni"))
                else "avx2" if HAS_AVX2 else "portable")
    assert kernels.vector_path() == expected


def test_blocks_past_eight_rows_run_on_amx_where_the_cpu_has_it():
    """Else the row tests above would not reach the AMX path on a CPU that has it."""
    assert kernels.amx() == all(f in FLAGS for f in ("amx_tile", "amx_int8", "avx512_vnni"))


@pytest.mark.skipif(not HAS_AVX2, reason="the CPU has no AVX2")
@pytest.mark.parametrize("kind", ["q3", "q4", "q6", "q8"])
def test_the_avx2_build_gives_the_same_bits(kind):
    """The AVX2 path (what a CPU without AVX-512 VNNI runs), built for x86-64-v3 here, against
    the portable path: its maddubs products must not saturate (Q8: codes signed, |x| times them)."""
    assert kernels.vector_path("x86-64-v3") == "avx2"
    for out, inputs in SHAPES:
        packed = kernels.pack(weight(kind, out, inputs, seed=3))
        x = torch.randn(11, inputs) * 4
        x[0, :32] = 127.0  # the largest activations meet the largest codes
        full = kernels.linear(x, packed, None, torch.float32, march="x86-64-v3")
        assert torch.equal(full, kernels.linear(x, packed, None, torch.float32, portable=True))
        assert all(torch.equal(kernels.linear(x[i : i + 3], packed, None, torch.float32, march="x86-64-v3"),
                               full[i : i + 3]) for i in range(8))


def test_the_kernels_share_torchs_openmp_runtime():
    kernels.library()
    maps = open("/proc/self/maps").read()
    assert len({line.split()[-1] for line in maps.splitlines() if "libgomp" in line}) == 1


def _random_blocks(kind: GGMLQuantizationType, rows: int, inputs: int, scale_at: list[int]) -> np.ndarray:
    """Random bytes for `rows` rows of GGUF blocks, their fp16 scale fields set to finite values."""
    elems, size = quants.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(int(kind))
    raw = rng.integers(0, 256, (rows * inputs // elems, size), dtype=np.uint8)
    for at in scale_at:
        raw[:, at : at + 2] = (rng.random(raw.shape[0]) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


_T = GGMLQuantizationType
GGUF_FORMS = [(_T.Q4_K, q4k_split, [0, 2]), (_T.Q5_K, q5k_split, [0, 2]), (_T.Q6_K, q6k_split, [208]),
              (_T.Q4_0, q40_split, [0]), (_T.Q4_1, q41_split, [0, 2]), (_T.Q5_0, q50_split, [0]),
              (_T.Q5_1, q51_split, [0, 2]), (_T.Q8_0, q80_split, [0])]


def _gguf_blocks(kind, rows: int, inputs: int, scale_at: list[int]) -> np.ndarray:
    raw = _random_blocks(kind, rows, inputs, scale_at)
    if kind == _T.Q8_0:  # llama.cpp writes |q| <= 127 (q80_split refuses -128)
        codes = raw.reshape(-1, 34)[:, 2:].view(np.int8)
        codes[codes == -128] = -127
    return raw


@pytest.mark.parametrize("kind, split, scale_at", GGUF_FORMS)
def test_gguf_blocks_decode_to_gguf_pys_floats(kind, split, scale_at):
    """Every block type of common GGUF files is kept exactly: the weight specdec runs decodes to
    gguf-py's own floats bit for bit, and the kernels' product is that of those floats."""
    rows, inputs = 32, 512
    raw = _gguf_blocks(kind, rows, inputs, scale_at)
    ours = split(raw, (rows, inputs)).dequantize()
    theirs = torch.from_numpy(np.asarray(quants.dequantize(raw, kind), dtype=np.float32).reshape(rows, inputs))
    assert torch.equal(ours, theirs)
    x = torch.randn(3, inputs)
    y = kernels.linear(x, kernels.pack(split(raw, (rows, inputs))), None, torch.float32)
    expected = activations(x) @ theirs.double().T
    assert (y.double() - expected).abs().max() < 1e-5 * expected.abs().max()


@pytest.mark.parametrize("kind, split, scale_at", GGUF_FORMS)
def test_gguf_forms_give_the_same_bits_in_any_block_and_on_every_path(kind, split, scale_at):
    rows, inputs = 48, 768
    packed = kernels.pack(split(_gguf_blocks(kind, rows, inputs, scale_at), (rows, inputs)))
    x = torch.randn(9, inputs) * 4
    x[0, :32] = 127.0  # the largest activations meet the largest codes
    full = kernels.linear(x, packed, None, torch.float32)
    assert torch.equal(kernels.linear(x, packed, None, torch.float32, portable=True), full)
    assert all(torch.equal(kernels.linear(x[i : i + 2], packed, None, torch.float32), full[i : i + 2]) for i in range(7))
    if HAS_AVX2:
        assert torch.equal(kernels.linear(x, packed, None, torch.float32, march="x86-64-v3"), full)


def test_a_q8_0_code_of_minus_128_is_refused():
    raw = _random_blocks(_T.Q8_0, 16, 32, [0])
    raw.reshape(-1, 34)[0, 2] = 0x80
    with pytest.raises(SpecdecError, match="-128"):
        q80_split(raw, (16, 32))


def test_rounding_stays_within_its_error_and_keeps_zeros():
    dense = torch.randn(64, 512)
    error = lambda w: ((w.dequantize() - dense).norm() / dense.norm()).item()
    assert error(q4_rtn(dense)) < 0.10 and error(q4_rtn(dense, 128)) < 0.15 and error(q8_rtn(dense)) < 0.01
    q4 = q4_rtn(dense)
    assert int(q4.codes.max()) <= 15 and q4.sub_scales.dtype == torch.uint8
    zeros = torch.zeros(16, 64)
    assert torch.equal(q4_rtn(zeros).dequantize(), zeros) and torch.equal(q8_rtn(zeros).dequantize(), zeros)


def test_a_failed_build_says_why_and_leaves_no_library(tmp_path, monkeypatch):
    broken = tmp_path / "qgemm.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(kernels, "SOURCE", broken)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SpecdecError, match="compiling qgemm.cpp failed"):
        kernels.library_path()
    assert not any((tmp_path / "cache" / "kernels").glob("qgemm-*"))


def test_q3_rounding_searches_below_min_max_rounding():
    dense = torch.randn(64, 512)
    error = lambda w: ((w.dequantize() - dense).norm() / dense.norm()).item()
    groups = dense.reshape(64, -1, 32)
    low, high = groups.amin(-1).clamp_max(0), groups.amax(-1)
    min_max = _affine(dense, (high - low) / 7, -low, 3, 8)
    q3 = q3_rtn(dense)
    assert q3.bits == 3 and int(q3.codes.max()) <= 7 and q3.codes.dtype == torch.uint8 and q3.scales.shape == (64, 1)
    assert error(q3) < 0.20 and error(q3) < 0.95 * error(min_max), (error(q3), error(min_max))
    assert torch.equal(q3_rtn(torch.zeros(16, 64)).dequantize(), torch.zeros(16, 64))


@pytest.mark.parametrize("kind", ["q3", "q4", "q6", "q8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_input_makes_its_rows_outputs_non_finite_on_every_path(kind, bad):
    """A NaN or inf activation must reach every output of its row (the runtime flags a round by
    its logits, runtime.hf.causal_lm): max instructions and fmax drop a NaN operand, which once made the
    AVX2 and portable paths quantize it to a number and give finite logits. The other rows keep
    their bits."""
    out, inputs = SHAPES[2]
    packed = kernels.pack(weight(kind, out, inputs, seed=4))
    x = torch.randn(6, inputs)
    clean = kernels.linear(x, packed, None, torch.float32)
    x[2, 40] = bad
    builds = [{}, {"portable": True}] + ([{"march": "x86-64-v3"}] if HAS_AVX2 else [])
    for build in builds:
        y = kernels.linear(x, packed, None, torch.float32, **build)
        assert not torch.isfinite(y[2]).any(), build
        assert torch.equal(torch.cat([y[:2], y[3:]]), torch.cat([clean[:2], clean[3:]])), build
