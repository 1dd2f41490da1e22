"""What this machine is, and how to time and weigh a run on it.

- `environment`: the facts every bench, sweep and advise run records in its configuration (git
  commit, date, CPU model and flags, whether bf16 is native, threads, dtype, library versions,
  the full method specs), gathered in one place;
- `native_bf16`, `cpu_flags`, `device_name`: what the processor offers;
- `synchronize`: wait for a device's queued work (a no-op on the CPU), before reading a clock;
- `PeakMemory`: the peak memory of one run, measured in the best way the platform allows.
  ru_maxrss would be the peak of the whole process lifetime, useless per run, so instead:
  CUDA: torch's peak allocation since a reset; Linux CPU: the kernel's resident high-water mark
  (VmHWM), which writing "5" to /proc/self/clear_refs resets; elsewhere: the RSS after the run.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

import psutil  # installed with accelerate, a declared dependency
import torch

_CPUINFO = Path("/proc/cpuinfo")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")

# The CPU flags that decide how fast a decode step and a verify block run: bf16 is native with
# avx512_bf16 or amx_bf16 (else emulated and compute-bound); int8 kernels use avx512_vnni/amx_int8.
RECORDED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

KINDS = {
    "cuda_max_allocated": "peak bytes allocated by torch on the GPU during the run",
    "rss_peak": "peak resident memory of the process during the run (Linux VmHWM, reset before each run)",
    "rss_after_run": "resident memory of the process right after the run (no per-run peak available)",
}


def cpu_flags() -> set[str]:
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX-512 BF16 or AMX)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return any(f in capability for f in ("BF16", "AMX")) or bool(cpu_flags() & BF16_FLAGS)


def device_name(device: str) -> str:
    """The GPU's name, or the processor's model name from /proc/cpuinfo."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with _CPUINFO.open(encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def synchronize(device: torch.device | str) -> None:
    """Wait until the device has run everything queued (CUDA); nothing to wait for on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def environment(device: str, dtype: str, methods: Iterable[str] = (), quant: dict | None = None) -> dict:
    """The facts a run's figures depend on, for its config.json: where the code came from
    (git commit, whether the tree had uncommitted changes), when, on what (CPU model and the
    flags that matter, native bf16 or not, threads), with what (dtype, the target's weight
    quantization `quant`, torch, transformers, llama-cpp-python where a method runs it) and which
    methods, each as its full spec (a draft's quantization is in its spec). The date and the git state describe the run's
    start: a resumed run may differ in them (store.VOLATILE)."""
    import transformers

    flags = cpu_flags()
    methods = list(methods)
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if (status := _git("status", "--porcelain", "--untracked-files=no")) is None else bool(status),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device,
        "device_name": device_name(device),
        "cpu": device_name("cpu"),
        "cpu_flags": {flag: flag in flags for flag in RECORDED_FLAGS},
        "native_bf16": native_bf16(),
        "threads": torch.get_num_threads(),
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **({"llama_cpp": llama_cpp_build()} if any(m.startswith("llamacpp") for m in methods) else {}),
        "quant": quant or {"target": "none"},
        "methods": methods,
    }


def llama_cpp_build() -> dict:
    """llama-cpp-python's version and the CPU features its llama.cpp was compiled for: the set-up
    builds for x86-64-v3 (AVX2) so that a cached wheel runs on any runner, and a build for this
    CPU's own set (AVX-512 here and there) decodes at another speed."""
    try:
        import llama_cpp
    except ImportError:
        return {"version": None, "cpu_features": None}
    features = llama_cpp.llama_print_system_info().decode(errors="replace")
    # "CPU : SSE3 = 1 | AVX2 = 1 | ..." -> the names set to 1
    names = [part.split("=")[0].split(":")[-1].strip() for part in features.split("|") if part.strip().endswith("= 1")]
    return {"version": _version("llama_cpp_python"), "cpu_features": sorted(names)}


def load_average() -> list[float]:
    """The 1/5/15-minute load average, printed beside speed figures: llama.cpp's threads spin at
    barriers, so another busy process on a 2-core machine cuts its speed several times over."""
    import os

    return [round(x, 2) for x in os.getloadavg()]


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _git(*command: str) -> str | None:
    """Output of a git command run in specdec's own source folder; None outside a checkout."""
    try:
        done = subprocess.run(["git", *command], cwd=Path(__file__).parent, capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


class PeakMemory:
    """reset() before a run, read() after it; `kind` names what is measured (see KINDS)."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            self.kind = "cuda_max_allocated"
        else:
            self.kind = "rss_peak" if _reset_hwm() else "rss_after_run"

    def reset(self) -> None:
        if self.kind == "cuda_max_allocated":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind == "rss_peak":
            _reset_hwm()

    def read(self) -> int:
        if self.kind == "cuda_max_allocated":
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.kind == "rss_peak":
            return _hwm_bytes()
        return int(psutil.Process().memory_info().rss)


def _reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return _hwm_bytes() > 0
    except (OSError, ValueError):
        return False


def _hwm_bytes() -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise ValueError("no VmHWM in /proc/self/status")
