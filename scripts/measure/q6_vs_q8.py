"""The int4 target with its Q6_K tensors in the kernels' 6-bit layout (Q6, what specdec loads)
against the same codes in the 8-bit one (Q8, before 2026-12-07): logits compared bit for bit, and
1- and 8-row forwards timed paired (the two models alternate, the order flipping each round,
the first two rounds discarded), after the HumanEval/0 chat prompt and after 1,024 tokens of the
HumanEval text. Run under the CPU lock:

    flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/measure/q6_vs_q8.py --out q6.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.decode.batch import forward_blocks
from specdec.kernels import Packed
from specdec.models.load import load_tokenizer
from specdec.runtime.native import loader

from runtime_bench import TARGET, cpu, humaneval, long_prompt


def as_q8(p: Packed) -> Packed:
    """A Q6 weight's codes in Q8's layout [tile, group, load j, lane, byte] (others as they are)."""
    if p.bits != 6:
        return p
    nibbles, top = p.codes[..., :128].reshape(*p.codes.shape[:2], 2, 64), p.codes[..., 128:]
    loads = [((nibbles[:, :, j // 2] >> (4 * (j % 2))) & 15) | (((top >> (2 * j)) & 3) << 4) for j in range(4)]
    return Packed(8, torch.stack(loads, 2).reshape(*p.codes.shape[:2], 4, 16, 4).contiguous(), p.subs, p.supers,
                  p.per_super, p.zero)


def both_forms():
    stored, model = loader.store_gguf(TARGET, "int4")
    six = loader._native_lm(loader.load_weights(stored, model.config, None), model.config, model.eos, loader.CAPACITY)
    weights = loader.load_weights(stored, model.config, None)
    for linear in [*(x for layer in weights.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)),
                   weights.head]:
        linear.parts[:] = [as_q8(p) for p in linear.parts]
    eight = loader._native_lm(weights, model.config, model.eos, loader.CAPACITY)
    return {"q6": six, "q8": eight}


def paired(lms: dict, prompt: torch.Tensor, rounds: int) -> dict:
    lanes = {}
    for name, lm in lms.items():
        lane = lm.lane(prompt.numel() + 16)
        lanes[name] = (lane, lane.prefill(prompt))
    out = {"prefill_logits_equal": torch.equal(lanes["q6"][1], lanes["q8"][1])}

    def forward(name: str, n: int):
        lane = lanes[name][0]
        began = time.perf_counter()
        logits = forward_blocks([(lane, prompt[:n], False)])
        seconds = time.perf_counter() - began
        lane.trim(prompt.numel())
        return seconds, logits

    for n in (1, 8):
        out[f"rows {n} logits equal"] = all(torch.equal(a, b) for a, b in zip(forward("q6", n)[1], forward("q8", n)[1]))
        times = {name: [] for name in lms}
        for r in range(rounds + 2):
            for name in (("q6", "q8") if r % 2 else ("q8", "q6")):
                seconds = forward(name, n)[0]
                if r >= 2:
                    times[name].append(seconds)
        out[f"rows {n}"] = {**{f"{name}_ms": round(1e3 * statistics.median(t), 2) for name, t in times.items()},
                            "paired_q6_over_q8": round(statistics.median(a / b for a, b in zip(times["q6"], times["q8"])), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--out", default="/tmp/q6_vs_q8.json")
    args = parser.parse_args()
    lms = both_forms()
    tokenizer = load_tokenizer(TARGET)
    report = {"cpu": cpu(), "weight_bytes": {name: lm.weight_bytes() for name, lm in lms.items()}}
    for label, prompt in (("chat prompt", humaneval(tokenizer, 1)[0]), ("1024 tokens", long_prompt(tokenizer, 1024))):
        report[f"context: {label} ({prompt.numel()} tokens)"] = paired(lms, prompt, args.rounds)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
