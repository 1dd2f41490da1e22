#!/usr/bin/env python
"""Target and draft forwards over an n-position cache, in the preallocated layout (specdec's
default) against transformers' concatenating DynamicCache: paired, interleaved, warm-up pass
discarded, medians. The cache holds random keys and values (a forward's time does not depend on
them) so no long prefill is needed; each timed forward is trimmed off again, as a decode round is.

    .venv/bin/python scripts/kv_layout_cost.py --contexts 512,2048,8192 --out docs/kv_layout.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.decode.lm import CausalLM
from specdec.models.draft_quant import int8_draft
from specdec.models.load import load_model


@torch.inference_mode()
def filled(model, preallocate: bool, n: int, gen: torch.Generator) -> CausalLM:
    """A CausalLM whose cache holds n positions of random keys and values."""
    lm = CausalLM(model, preallocate)
    cfg = model.config
    shape = (1, cfg.num_key_value_heads, n, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    lm.cache.reserve(n + 64)
    for index, layer in enumerate(lm.cache.hf_cache.layers):
        keys = torch.randn(shape, generator=gen, dtype=model.dtype)
        layer.update(keys, torch.randn(shape, generator=gen, dtype=model.dtype), index)
    lm._hold(0, torch.zeros(n, dtype=torch.long))  # token ids behind the positions, kept in step
    return lm


def time_layouts(model, n: int, rows: list[int], passes: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    lms = {"preallocated": filled(model, True, n, gen), "dynamic": filled(model, False, n, gen)}
    tokens = torch.randint(0, 1000, (max(rows),), generator=gen)
    times = {(layout, r): [] for layout in lms for r in rows}
    for p in range(passes + 1):  # pass 0 warms up, discarded
        for r in rows:
            for layout, lm in lms.items():
                start = time.perf_counter()
                lm.forward(tokens[:r])
                elapsed = time.perf_counter() - start
                lm.cache.trim(n)
                if p:
                    times[layout, r].append(elapsed)
    out = {}
    for r in rows:
        pre, dyn = times["preallocated", r], times["dynamic", r]
        out[str(r)] = {"preallocated_s": statistics.median(pre), "dynamic_s": statistics.median(dyn),
                       "paired_ratio": statistics.median(d / q for d, q in zip(dyn, pre))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="512,2048,8192")
    parser.add_argument("--rows", default="1,3", help="block sizes timed (1 = a decode step, 3 = a k=2 verify)")
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--out", help="write the medians here as JSON")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    target, _ = load_model("qwen2.5-coder-1.5b-instruct")
    draft, tokenizer = load_model("qwen2.5-coder-0.5b-instruct")
    models = {"target": target, "draft-int8": int8_draft(draft)}
    results = {}
    for n in (int(c) for c in args.contexts.split(",")):
        for name, model in models.items():
            results[f"{name}@{n}"] = entry = time_layouts(model, n, rows, args.passes)
            for r, e in entry.items():
                print(f"{name} context {n}, {r} rows: preallocated {e['preallocated_s'] * 1e3:.0f} ms, "
                      f"dynamic {e['dynamic_s'] * 1e3:.0f} ms, paired dynamic/preallocated {e['paired_ratio']:.3f}",
                      flush=True)
    if args.out:  # written whole or not at all
        partial = Path(args.out).with_suffix(".partial")
        partial.write_text(json.dumps({"threads": torch.get_num_threads(), "passes": args.passes, "results": results},
                                      indent=1))
        partial.replace(args.out)


if __name__ == "__main__":
    main()
