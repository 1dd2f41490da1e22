"""The VNNI Q4 tile alone (qgemm.cpp's vnni_rows<R>), one thread, its codes in L1/L2: nanoseconds
per (tile, group of 32 inputs) for R rows, for one or more versions of qgemm.cpp, alternating
(A B B A ...; a first round discarded) so a change in the machine's speed falls on all; medians and paired ratios to the
first. It separates the product's own instruction cost from memory, quantization and threads
(docs/runtime.md, "What bounds the Q4 tile"):

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/q4_tile.py src/specdec/kernels DIR_B ... --rows 8,16

Each folder holds a qgemm.cpp; the harness includes it (its functions are in an anonymous
namespace) and is built with the kernels' own flags (-O3 -ffp-contract=off -march=native)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from specdec.kernels import FLAGS

HARNESS = r"""
#include QGEMM
#include <chrono>
#include <cstdio>
#include <random>
// Calls through a pointer the compiler cannot see through, so nothing is hoisted out of the loop.
__attribute__((noinline)) void call(const Q4& w, int64_t K, float (*out)[16]) { vnni_rows<ROWS>(w, acts, K, 0, 0, out); }
void (*volatile entry)(const Q4&, int64_t, float (*)[16]) = call;
int main(int argc, char** argv) {
    const int64_t K = atol(argv[1]), G = K / 32;
    const long calls = atol(argv[2]);
    std::mt19937 rng(1);
    std::vector<uint8_t> codes(G * 256), subs(G * 32);
    for (auto& c : codes) c = uint8_t(rng());
    for (auto& s : subs) s = uint8_t(rng() % 64);
    std::vector<float> supers((G + 7) / 8 * 32, 0.01f), x(ROWS * K);
    for (auto& v : x) v = float(int(rng() % 2001) - 1000) / 1000.f;
    const Q4 w{codes.data(), subs.data(), supers.data(), 8};
    quantize_rows(x.data(), 0, ROWS, K, 0, 0, acts);
    float out[16][16], sink = 0;
    for (long i = 0; i < calls / 10; ++i) entry(w, K, out);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
        entry(w, K, out);
        sink += out[i & (ROWS - 1)][i & 15];
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%.4f %g\n", s * 1e9 / (calls * G), sink);
}
"""


def build(folder: Path, rows: int, work: Path) -> Path:
    source = work / "harness.cpp"
    source.write_text(HARNESS)
    exe = work / f"{folder.resolve().as_posix().replace('/', '_')}-{rows}"
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
    cmd = ["g++", *flags, "-march=native", f'-DQGEMM="{(folder / "qgemm.cpp").resolve()}"', f"-DROWS={rows}",
           str(source), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="folders with a qgemm.cpp; the first is the base")
    parser.add_argument("--rows", default="8,16", help="R of vnni_rows<R> (powers of two up to 16), comma-separated")
    parser.add_argument("--inputs", type=int, default=8960, help="K: the tile's inputs (8960: the 1.5B target's down)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (int(r) for r in args.rows.split(",")):
            exes = [build(f, rows, Path(tmp)) for f in args.folders]
            times: list[list[float]] = [[] for _ in exes]
            for round_ in range(args.rounds + 1):  # round 0 discarded: the first runs read apart
                order = range(len(exes)) if round_ % 2 == 0 else reversed(range(len(exes)))
                for i in order:
                    got = subprocess.run([str(exes[i]), str(args.inputs), str(4_000_000 // rows)], check=True,
                                         capture_output=True, text=True).stdout
                    if round_:
                        times[i].append(float(got.split()[0]))
            for i, folder in enumerate(args.folders):
                row = {"ns_per_tile_group": round(statistics.median(times[i]), 3),
                       "ns_per_row_group": round(statistics.median(times[i]) / rows, 4),
                       "paired_ratio_to_first": round(statistics.median(t / b for t, b in zip(times[i], times[0])), 3)}
                report[f"{folder} rows={rows}"] = row
                print(f"{str(folder):40s} rows {rows:2d}: {row}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
