"""specdec's int8-activation kernels for Q3, Q4, Q5, Q6 and Q8 weights (qgemm.cpp; formats: quant.weights).

The C++ source is compiled once per machine with the system's C++ compiler (-march=native: the
AVX-512 VNNI path where the CPU has it, with AMX tiles for blocks of 9-16 rows where it has those,
else the AVX2 one, else the portable one) into the model
cache, keyed by the source, the flags, the compiler and the CPU's flags, and loaded with ctypes. It links the
OpenMP runtime torch already loaded (libgomp.so.1), so its threads are torch's threads
(torch.set_num_threads applies) and no second pool spins beside them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ..errors import SpecdecError
from ..files import cache_root, exclusive
from ..quant.weights import Q4_GROUP, Q8_GROUP, SUPER, Q4Weight, Q8Weight

SOURCE = Path(__file__).with_name("qgemm.cpp")
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-Wall")
PATHS = {2: "avx512-vnni", 1: "avx2", 0: "portable"}  # sd_vector_path()


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        path = name and shutil.which(name)
        if path:
            return path  # a full path: gcc finds its own programs from it even where PATH is unset
    raise SpecdecError("int8/int4 layers need a C++ compiler to build specdec's kernels once (install g++, "
                       "e.g. `apt install g++`, or set CXX)")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def library_path(march: str = "native", source: Path | None = None) -> Path:
    """Where the compiled kernels for this source, compiler, CPU and -march live (built if
    missing; another `march` than native builds an older instruction set's path, for tests).
    `source`: another C++ file of this folder that includes qgemm.cpp (runtime's decoder.cpp)."""
    source = source or SOURCE  # read at the call: tests plant another source
    compiler = _compiler()
    flags = (*FLAGS, f"-march={march}")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    texts = [p.read_text() for p in dict.fromkeys((source, SOURCE))]  # qgemm.cpp's key unchanged
    key = hashlib.sha256("\n".join([*texts, " ".join(flags), version, _cpu_flags()]).encode())
    folder = cache_root() / "kernels"
    path = folder / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    with exclusive(folder, "build"):  # one build at a time (test workers, parallel runs)
        if not path.exists():
            what = "the int8/int4 kernels" if source == SOURCE else "the native decoder"
            print(f"specdec: compiling {what} for this CPU (seconds, once)", file=sys.stderr)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            env = {**os.environ, "PATH": os.environ.get("PATH") or os.defpath}  # the linker is found by PATH
            done = subprocess.run([compiler, *flags, str(source), "-o", str(tmp)], capture_output=True, text=True,
                                  env=env)
            if done.returncode:
                tmp.unlink(missing_ok=True)
                raise SpecdecError(f"compiling {source.name} failed ({compiler}):\n{done.stderr[-2000:]}")
            os.replace(tmp, path)  # whole or not at all
    return path


@cache
def library(march: str = "native") -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path(march)))
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    for low in (lib.sd_q3_linear, lib.sd_q4_linear, lib.sd_q5_linear):
        low.argtypes = [p, i, i64, i64, i64, p, p, p, i64, p, p, i, i]
        low.restype = None
    for high in (lib.sd_q6_linear, lib.sd_q8_linear):
        high.argtypes = [p, i, i64, i64, i64, p, p, p, i, i64, p, p, i, i]
        high.restype = None
    return lib


def vector_path(march: str = "native") -> str:
    """The kernels' vector path on this CPU: avx512-vnni, avx2 or portable (none)."""
    return PATHS[library(march).sd_vector_path()]


def amx() -> bool:
    """Whether blocks of more than 8 rows run on the CPU's AMX tiles (built for them, granted by
    the OS); their bits are the VNNI path's."""
    return bool(library().sd_amx())


@dataclass
class Packed:
    """A Q3, Q4, Q5, Q6 or Q8 weight in the kernels' tile layout (qgemm.cpp's header)."""

    bits: int
    codes: torch.Tensor
    subs: torch.Tensor
    supers: torch.Tensor
    per_super: int  # groups per super-block
    zero: int = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.subs, self.supers))

    @property
    def in_features(self) -> int:
        return self.codes.shape[1] * (Q8_GROUP if self.bits in (6, 8) else Q4_GROUP)  # codes: [tiles, groups, ...]


def _tiles(per_row: torch.Tensor) -> torch.Tensor:
    """[out, n] -> [out/16, n, 16]: a tile's 16 outputs side by side."""
    out, n = per_row.shape
    return per_row.reshape(out // 16, 16, n).transpose(1, 2)


def pack(weight: Q4Weight | Q8Weight) -> Packed:
    out, inputs = weight.codes.shape
    tiles = out // 16
    if isinstance(weight, Q4Weight):
        groups = inputs // Q4_GROUP
        codes = _LOW_CODES[weight.bits](weight.codes.reshape(tiles, 16, groups, 32)).reshape(tiles, groups, -1)
        subs = torch.cat([_tiles(weight.sub_scales), _tiles(weight.sub_mins)], dim=-1)
        supers = torch.cat([_tiles(weight.scales), _tiles(weight.mins)], dim=-1).float()
        return Packed(weight.bits, codes.contiguous(), subs.contiguous(), supers.contiguous(), weight.per_super)
    groups = inputs // Q8_GROUP
    codes = weight.codes.reshape(tiles, 16, groups, 4, 4).permute(0, 2, 3, 1, 4)  # [tile, group, j, lane, byte]
    if weight.bits == 6:
        codes = _q6_codes(codes)
    return Packed(weight.bits, codes.contiguous(), _tiles(weight.sub_scales).contiguous(),
                  _tiles(weight.scales).float().contiguous(), weight.per_super, weight.zero)


def _q6_codes(c: torch.Tensor) -> torch.Tensor:
    """[tile, group, 4 (j), lane, 4 (byte)] codes below 64 -> [tile, group, 192 bytes]: loads 0
    and 1 in the low and high nibbles of a vector [lane, byte], loads 2 and 3 in a second, then
    a plane holding at bits 2j, 2j+1 the top two bits of load j's byte."""
    low = c & 15
    nibbles = torch.stack([low[:, :, 0] | (low[:, :, 1] << 4), low[:, :, 2] | (low[:, :, 3] << 4)], dim=2)
    top = ((c >> 4) << (2 * torch.arange(4, dtype=torch.uint8)).view(1, 1, 4, 1, 1)).sum(2, dtype=torch.uint8)
    return torch.cat([nibbles.flatten(2), top.flatten(2)], dim=-1)


def _q4_codes(q: torch.Tensor) -> torch.Tensor:
    """[tile, lane, group, 32] codes -> [tile, group, 4 (j), lane, 4 (byte)]: inputs 4j+b in the
    low nibbles, 16+4j+b in the high ones."""
    q = q.reshape(*q.shape[:3], 2, 4, 4).permute(0, 2, 4, 1, 5, 3)  # [tile, group, j, lane, byte, half]
    return q[..., 0] | (q[..., 1] << 4)


def _q3_codes(q: torch.Tensor) -> torch.Tensor:
    """[tile, lane, group, 32] codes -> [tile, group, 3 (plane), lane, 4 (byte)]: planes 0 and 1
    the low 2 bits of inputs 4s+b of each half at bits 2s, plane 2 the third bits of 4j+b at bit j."""
    q = q.permute(0, 2, 1, 3).reshape(*q.shape[:1], q.shape[2], 16, 8, 4)  # [tile, group, lane, j, byte]
    shifts = torch.arange(4, dtype=torch.uint8).view(1, 1, 1, 4, 1)
    low = [((q[:, :, :, 4 * h:4 * h + 4] & 3) << (2 * shifts)).sum(3, dtype=torch.uint8) for h in (0, 1)]
    third = (((q >> 2) & 1) << torch.arange(8, dtype=torch.uint8).view(1, 1, 1, 8, 1)).sum(3, dtype=torch.uint8)
    return torch.stack([*low, third], dim=2)


def _q5_codes(q: torch.Tensor) -> torch.Tensor:
    """[tile, lane, group, 32] codes -> [tile, group, 320 bytes]: Q4's nibbles of the low 4 bits,
    then a plane [lane, byte] holding at bit j the fifth bit of input 4j+b."""
    nibbles = _q4_codes(q & 15).reshape(*q.shape[:1], q.shape[2], 256)
    fifth = ((q >> 4) & 1).permute(0, 2, 1, 3).reshape(*q.shape[:1], q.shape[2], 16, 8, 4)  # [.., lane, j, byte]
    plane = (fifth << torch.arange(8, dtype=torch.uint8).view(1, 1, 1, 8, 1)).sum(3, dtype=torch.uint8)
    return torch.cat([nibbles, plane.reshape(*q.shape[:1], q.shape[2], 64)], dim=-1)


_LOW_CODES = {3: _q3_codes, 4: _q4_codes, 5: _q5_codes}  # bits -> packing of a Q3/Q4/Q5 weight's codes

_NATIVE = (torch.float32, torch.bfloat16)  # activation and output dtypes the kernels read and write


def linear(x: torch.Tensor, weight: Packed, bias: torch.Tensor | None, out_dtype: torch.dtype,
           portable: bool = False, march: str = "native") -> torch.Tensor:
    """x [rows, in] @ W^T (+ bias, float32) -> [rows, out] in out_dtype. `portable`: the portable
    path even where a vector one runs; `march`: the build to use (tests compare them)."""
    if x.dtype not in _NATIVE:
        x = x.float()
    if not x.is_contiguous():
        x = x.contiguous()
    rows, inputs = x.shape
    out_features = weight.codes.shape[0] * 16
    y = torch.empty(rows, out_features, dtype=out_dtype if out_dtype in _NATIVE else torch.float32)
    lib = library(march)
    head = (x.data_ptr(), x.dtype == torch.bfloat16, rows, inputs, out_features, weight.codes.data_ptr(),
            weight.subs.data_ptr(), weight.supers.data_ptr())
    tail = (None if bias is None else bias.data_ptr(), y.data_ptr(), y.dtype == torch.bfloat16, portable)
    if weight.bits in (6, 8):
        getattr(lib, f"sd_q{weight.bits}_linear")(*head, weight.zero, weight.per_super, *tail)
    else:
        getattr(lib, f"sd_q{weight.bits}_linear")(*head, weight.per_super, *tail)
    return y if y.dtype == out_dtype else y.to(out_dtype)


__all__ = ["Packed", "SUPER", "linear", "pack", "vector_path"]
