"""Cost of a target forward over a block of n tokens, relative to one token (quoted in the first
docs/generate.md: `git show f08191e:docs/generate.md`).

Usage: .venv/bin/python scripts/cost_curve.py MODEL DTYPE     e.g. qwen2.5-coder-1.5b-instruct float32
"""

import sys
import time

import torch

from specdec.decode.lm import CausalLM
from specdec.models.load import load_model

PREFIX, REPEATS = 60, 4


def main(name: str, dtype: str) -> None:
    model, _ = load_model(name, dtype=dtype)
    lm = CausalLM(model)
    lm.forward(torch.arange(PREFIX), last_only=True)
    cost = {}
    for n in (1, 2, 3, 4, 5, 6, 8, 12, 16):
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            lm.forward(torch.arange(n))
            times.append(time.perf_counter() - start)
            lm.cache.trim(PREFIX)
        cost[n] = sorted(times)[REPEATS // 2 - 1]
    print(name, dtype, {n: round(c / cost[1], 2) for n, c in cost.items()}, f"C(1)={cost[1]:.3f}s")


if __name__ == "__main__":
    main(*sys.argv[1:3])
