"""Peak memory of one benchmark run, measured in the best way the platform allows.

ru_maxrss would be the peak of the whole process lifetime, useless per run, so instead:
CUDA: torch's peak allocation since a reset; Linux CPU: the kernel's resident high-water mark
(VmHWM), which writing "5" to /proc/self/clear_refs resets; elsewhere: the RSS after the run.
"""

from __future__ import annotations

from pathlib import Path

import psutil  # installed with accelerate, a declared dependency
import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")

KINDS = {
    "cuda_max_allocated": "peak bytes allocated by torch on the GPU during the run",
    "rss_peak": "peak resident memory of the process during the run (Linux VmHWM, reset before each run)",
    "rss_after_run": "resident memory of the process right after the run (no per-run peak available)",
}


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
