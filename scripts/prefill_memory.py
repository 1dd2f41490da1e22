#!/usr/bin/env python
"""Peak memory and time of prefilling one long prompt, by prefill block size (specdec.decode.lm.
PREFILL_CHUNK): the process's resident high-water mark is reset before each prefill and read
after it, above the resident memory at its start.

    .venv/bin/python scripts/prefill_memory.py --model qwen2.5-coder-1.5b-instruct --context 8192 --chunks 8192,1024
"""

from __future__ import annotations

import argparse
import time

import psutil
import torch

import specdec.decode.lm
from specdec.decode.lm import CausalLM
from specdec.machine import PeakMemory
from specdec.models.load import load_model
from specdec.prompts.long import long_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--chunks", default="8192,1024,512")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    ids = torch.tensor(long_prompt(tokenizer, args.context))
    memory = PeakMemory(model.device)
    for chunk in (int(c) for c in args.chunks.split(",")):
        specdec.decode.lm.PREFILL_CHUNK = chunk
        lm = CausalLM(model)
        base = psutil.Process().memory_info().rss
        memory.reset()
        start = time.perf_counter()
        last = lm.prefill(ids)
        elapsed = time.perf_counter() - start
        peak = memory.read()
        print(f"{args.model}, {args.context} tokens in blocks of {chunk}: {elapsed:.0f} s, resident before "
              f"{base / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB (+{(peak - base) / 2**30:.2f}), "
              f"next token {int(last.argmax())}", flush=True)
        del lm  # its cache goes before the next run


if __name__ == "__main__":
    main()
