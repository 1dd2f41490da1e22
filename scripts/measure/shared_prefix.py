"""Four live lanes over one 1,500-token prompt on the real target (issue 53): the three that
join a running one either copy its prompt's K/V into runs of their own (Decoder.move, what the
prefix cache did before) or read it in place (the prefix cache now). Per mode: each joining
lane's time to its first logits (the copy or the start, then its 8 own prompt rows), the K/V
bytes of the distinct slots the four lanes hold, and a decode step of the four lanes together.
The two modes' logits must be bitwise equal (checked every repetition). Each repetition prefills
the first lane once, then runs both modes, alternating which goes first; the first repetition is
discarded as warm-up; medians.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/shared_prefix.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.runtime.native.loader import gguf_model
from specdec.runtime.native.native_lm import NativeLM

SOURCE = Path(__file__).resolve().parents[2] / "src/specdec/decode/verify_tree.py"
PROMPT, OWN, STEPS = 1500, 8, 4


def prompts(tokenizer) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The shared prompt (real source, repeated to PROMPT tokens) and each joining lane's own."""
    ids = tokenizer.encode(SOURCE.read_text())
    shared = torch.tensor((ids * (PROMPT // len(ids) + 1))[:PROMPT], dtype=torch.long)
    return shared, [torch.cat([shared, torch.tensor(tokenizer.encode(f"\nQuestion {i}: what does it do?"))[:OWN]])
                    for i in range(3)]


def join(target: NativeLM, first: NativeLM, prompt: torch.Tensor, shared: bool) -> tuple[NativeLM, float, torch.Tensor]:
    """A lane holding `prompt` beside the live `first`: its slots copied or read in place; the
    seconds to its first logits, and those logits."""
    lane = target.lane(2048)
    began = time.perf_counter()
    if shared:
        target.prefixes.start(lane, prompt)
    else:
        lane.copy_from(first.slots(0, first.length), first.held_tokens)
    logits = lane.prefill(prompt, reuse=True)
    return lane, time.perf_counter() - began, logits


def run_mode(target: NativeLM, first: NativeLM, own: list[torch.Tensor], shared: bool) -> dict:
    lanes, firsts, logits = [first], [], []
    for prompt in own:
        lane, seconds, row = join(target, first, prompt, shared)
        lanes.append(lane)
        firsts.append(seconds)
        logits.append(row)
    slots = {s for lane in lanes for s in lane.slots(0, lane.length).tolist()}
    steps, tokens = [], [row.argmax(-1) for row in [logits[0]] + logits]  # the first lane's: any token
    for _ in range(STEPS):
        began = time.perf_counter()
        rows = NativeLM.forward_lanes([(lane, t.view(1), True) for lane, t in zip(lanes, tokens)])
        steps.append(time.perf_counter() - began)
        logits += rows
        tokens = [row.argmax(-1) for row in rows]
    for lane in lanes[1:]:
        lane.release()
    first.trim(PROMPT)  # the next mode starts from the same first lane
    return {"first_token_s": statistics.median(firsts), "kv_mb": target.kv_bytes(len(slots)) / 1e6,
            "step_s": statistics.median(steps), "logits": logits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = gguf_model("qwen2.5-coder-1.5b-instruct")
    shared, own = prompts(tokenizer)
    rows = []
    for rep in range(args.reps):
        target.prefixes.clear()
        first = target.lane(2048)
        target.prefixes.start(first, shared)
        first.prefill(shared)
        out = {}
        for mode in ([False, True] if rep % 2 else [True, False]):
            out[mode] = run_mode(target, first, own, mode)
        assert all(torch.equal(a, b) for a, b in zip(out[False]["logits"], out[True]["logits"]))
        first.release()
        row = {f"{'shared' if m else 'copy'}_{k}": v for m in out for k, v in out[m].items() if k != "logits"}
        print(json.dumps({"rep": rep, **row}), flush=True)
        if rep:
            rows.append(row)
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    print(json.dumps({"cpu": cpu, "medians": medians}))


if __name__ == "__main__":
    main()
