"""Kernel facts behind specdec's forward (docs/forward.md), on this machine: for each linear
kernel and dtype, (1) what specdec's probe finds for each layer shape (min_rows: whether a row
alone and the same row in blocks of 2..17 agree bitwise, over >= 2^20 outputs) and (2) the time of one pass over the 28 layers' linear weights
of the registry target (Qwen2.5-Coder-1.5B shapes, distinct random tensors, so every pass streams
them from memory) at 1..8 rows, with the read rate that implies; specdec's layers pad a block
below min_rows, as in generation.

    .venv/bin/python scripts/measure/kernel_facts.py --out docs/forward/kernels-<machine>.json
    .venv/bin/python scripts/measure/kernel_facts.py --kernels int4 --dtypes bfloat16 --rows 1,8,16,32 \
        --source /tmp/old/qgemm.cpp --out old.json   # another build of the kernels, for an A/B

Kernels: torch's F.linear (MKL for float32, oneDNN for bf16/fp16), specdec's PackedLinear
(oneDNN prepacked where the CPU runs the dtype, else F.linear), QuantLinear
Q8 and Q4 (specdec's int8-activation kernels, specdec.kernels). Takes 5-10 minutes on 2 cores."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from specdec import kernels  # noqa: E402
from specdec.runtime.hf.linear import PackedLinear, QuantLinear, onednn_packs, probe_min_rows  # noqa: E402
from specdec.machine import environment  # noqa: E402
from specdec.quant.weights import q4_rtn, q8_rtn  # noqa: E402

# (in, out) of one Qwen2.5-1.5B layer: q, k, v, o, gate, up, down.
SHAPES = [(1536, 1536), (1536, 256), (1536, 256), (1536, 1536), (1536, 8960), (1536, 8960), (8960, 1536)]
LAYERS = 28
ROWS = (1, 2, 3, 4, 6, 8)


class Plain(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight, self.in_features, self.out_features = linear.weight, linear.in_features, linear.out_features

    def forward(self, x):
        return F.linear(x, self.weight)

    def weight_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


def build(kind: str, linear: torch.nn.Linear, dtype: torch.dtype) -> torch.nn.Module:
    if kind == "F.linear":
        return Plain(linear.to(dtype))
    if kind == "packed":
        return PackedLinear(linear.to(dtype))
    if kind == "int8":
        return QuantLinear(q8_rtn(linear.weight.detach()), None, dtype)
    return QuantLinear(q4_rtn(linear.weight.detach(), 32), None, dtype)


def min_rows_by_shape(layers: list[torch.nn.Module], dtype: torch.dtype) -> dict[str, int | None]:
    """specdec's probe (runtime.hf.linear.probe_min_rows, >= 2^20 outputs) on each distinct shape's
    raw kernel, unpadded: 1 = a row alone and in any block of 2..17 agree bitwise, 2 = only a lone
    row differs, 17 = only a fixed block of 17 agrees, None = nothing agrees."""
    found = {}
    for layer in layers[:len(SHAPES)]:
        shape = f"{layer.in_features}x{layer.out_features}"
        if shape not in found:
            found[shape] = probe_min_rows(getattr(layer, "_compute", layer), layer.in_features, dtype,
                                          torch.device("cpu"))
    return found


def pass_ms(layers: list[torch.nn.Module], rows: int, dtype: torch.dtype, repeats: int = 5) -> float:
    x = {k: torch.randn(rows, k).to(dtype) for k in (1536, 8960)}
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for layer in layers:
            layer(x[layer.in_features])
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--kernels", default="F.linear,packed,int8,int4")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts timed, comma-separated")
    p.add_argument("--source", type=Path, help="another qgemm.cpp to build and time (default: specdec's)")
    args = p.parse_args()
    rows = [int(m) for m in args.rows.split(",")]
    if args.source:
        kernels.SOURCE = args.source.resolve()
    torch.manual_seed(0)
    facts = {"environment": environment("cpu", "various"), "layers": LAYERS, "shapes": SHAPES, "rows": rows,
             "source": str(args.source or kernels.SOURCE),
             "onednn_packs": {}, "kernels": {}}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        facts["onednn_packs"][name] = onednn_packs(dtype)
        for kind in args.kernels.split(","):
            layers = [build(kind, torch.nn.Linear(i, o, bias=False), dtype) for _ in range(LAYERS) for i, o in SHAPES]
            gb = sum(layer.weight_bytes() for layer in layers) / 1e9
            min_rows = min_rows_by_shape(layers, dtype)
            timing = {m: pass_ms(layers, m, dtype) for m in rows}
            facts["kernels"][f"{kind}/{name}"] = {
                "weight_gb": gb, "min_rows": min_rows,
                "pass_ms": timing, "read_gb_per_s": {m: gb / (t / 1e3) for m, t in timing.items()},
            }
            print(f"{kind:>8} {name:<9} {gb:5.2f} GB  min_rows {min_rows}  "
                  + "  ".join(f"M={m} {t:.0f} ms" for m, t in timing.items()), flush=True)
            del layers
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(facts, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
