#!/usr/bin/env python
"""What transformers' DynamicCache costs per decode step at a context: each layer's K and V are
grown by torch.cat (a copy of the whole layer cache); a preallocated cache writes one row."""
import statistics
import time

import torch

torch.set_num_threads(2)
layers, heads, dim = 28, 2, 128   # Qwen2.5-Coder-1.5B: 28 layers, 2 KV heads of 128
for ctx in (512, 2048, 8192):
    k = [torch.randn(1, heads, ctx, dim) for _ in range(2 * layers)]
    new = torch.randn(1, heads, 1, dim)
    big = [torch.empty(1, heads, ctx + 64, dim) for _ in range(2 * layers)]
    def cat():
        for t in k: torch.cat([t, new], dim=-2)
    def write():
        for b in big: b[:, :, ctx : ctx + 1].copy_(new)
    out = {}
    for name, f in (("cat", cat), ("prealloc", write)):
        f(); times = []
        for _ in range(7):
            s = time.perf_counter(); f(); times.append(time.perf_counter() - s)
        out[name] = statistics.median(times) * 1e3
    print(f"context {ctx}: DynamicCache cat {out['cat']:.1f} ms/step, preallocated write {out['prealloc']:.2f} ms/step")
