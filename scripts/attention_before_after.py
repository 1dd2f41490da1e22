"""Decode steps of the native runtime at long contexts, before and after a change of
kernels/decoder.cpp, paired on the same weights in one process (docs/runtime.md):

    flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/attention_before_after.py \
        --before a82207d --contexts 512 2048 4096 8192

The `--before` revision's decoder.cpp is compiled beside today's (its cache layout may differ:
the K/V a prefill wrote with today's decoder are copied into the other's layout, slot-major
[capacity][kv_heads * head_dim] per layer, since that revision's prefill at 8K takes minutes).
Then both decode the same tokens, step by step, alternating which goes first; each step's
seconds and the attention stage's are recorded and their medians printed as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from specdec.kernels import library_path
from specdec.runtime import load_registry
from specdec.runtime.lm import NativeLM
from specdec.runtime.native import SOURCE, Decoder, library, stage_seconds


def before_library(revision: str) -> ctypes.CDLL:
    """The decoder.cpp of `revision`, compiled (it includes today's qgemm.cpp, in the same folder)."""
    text = subprocess.run(["git", "show", f"{revision}:src/specdec/kernels/decoder.cpp"], capture_output=True,
                          text=True, check=True).stdout
    source = SOURCE.with_name(f"decoder_{revision}.cpp")
    source.write_text(text)
    try:
        lib = ctypes.CDLL(str(library_path(source=source)))
    finally:
        source.unlink()
    ref = library()  # today's, its argument types set
    lib.sd_decoder_forward.argtypes = ref.sd_decoder_forward.argtypes
    lib.sd_decoder_timings.argtypes = ref.sd_decoder_timings.argtypes
    lib.sd_decoder_forward.restype = lib.sd_decoder_timings.restype = None
    return lib


def twin(lm: NativeLM, lib: ctypes.CDLL, head_major: bool) -> NativeLM:
    """A second NativeLM over the same weights, run by `lib`, holding lm's cache slot-major
    (or head-major as today's, where the revision has that layout already)."""
    d = lm.decoder
    other = Decoder(d.weights, d._rotary, d.capacity)
    other._lib = lib
    layers, heads, capacity, dim = d.k_cache.shape
    for mine, theirs in ((d.k_cache, other.k_cache), (d.v_cache, other.v_cache)):
        if head_major:
            theirs.copy_(mine)
        else:
            theirs.view(layers, capacity, heads, dim).copy_(mine.permute(0, 2, 1, 3))
    out = NativeLM(other, lm.eos_token_ids, lm.max_positions)
    out._length, out._held = lm._length, lm._held.clone()
    return out


def attention_seconds(lib: ctypes.CDLL) -> float:
    out = (ctypes.c_double * 9)()
    lib.sd_decoder_timings(out)
    return out[3]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision of the decoder.cpp to compare with")
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[512, 2048, 4096, 8192])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", default="/tmp/attention_before_after.json")
    parser.add_argument("--head-major", action="store_true",
                        help="the revision's cache is head-major as today's (from 5cfd1f4 on): copied as it is")
    args = parser.parse_args()
    old = before_library(args.before)
    rows = []
    for name in args.models:
        for context in args.contexts:
            lm = load_registry(name, "int4", capacity=context + args.steps + 8)
            tokens = torch.randint(0, 30000, (context + args.steps,), generator=torch.Generator().manual_seed(0))
            began = time.perf_counter()
            lm.prefill(tokens[:context])
            prefill = time.perf_counter() - began
            sides = {"after": lm, "before": twin(lm, old, args.head_major)}
            steps = {side: [] for side in sides}
            attention = {side: [] for side in sides}
            stage_seconds(), attention_seconds(old)
            gap = 0.0  # largest logit difference of the two: 0 where the float operations are the same
            for i in range(args.steps):
                order = ("after", "before") if i % 2 == 0 else ("before", "after")
                logits = {}
                for side in order:
                    began = time.perf_counter()
                    logits[side] = sides[side].forward(tokens[context + i : context + i + 1], last_only=True)
                    steps[side].append(time.perf_counter() - began)
                    attention[side].append(stage_seconds()["attention"] if side == "after" else attention_seconds(old))
                gap = max(gap, float((logits["after"] - logits["before"]).abs().max()))
            row = {"model": name, "context": context, "prefill_after_s": prefill, "max_logit_gap": gap}
            for side in sides:  # the first step of each is a warm-up
                row[f"step_ms_{side}"] = 1e3 * statistics.median(steps[side][1:])
                row[f"attention_ms_{side}"] = 1e3 * statistics.median(attention[side][1:])
            row["step_ratio"] = row["step_ms_before"] / row["step_ms_after"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del lm, sides
    Path(args.out).write_text(json.dumps({"before": args.before, "threads": torch.get_num_threads(), "rows": rows},
                                         indent=1))


if __name__ == "__main__":
    main()
