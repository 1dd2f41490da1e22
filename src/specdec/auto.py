"""`--proposer auto`: the advisor's choice for this target, draft, dtype and machine.

`specdec advise` saves its recommendation in the cache folder (advice_dir), keyed by what the
measurement depends on (models, dtype, device, processor and thread count). `auto` reads it and
runs the recommended proposer and k, or plain decoding where the advice measured that
speculation does not pay. Without saved advice it uses the measured default for the device
(DEFAULT_CHOICE) and says how to calibrate.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .errors import SpecdecError

# Without advice: the best setting measured on a CPU without native bf16 (docs/bench/README.md,
# levers2 run: int8 draft k=2, 1.74x on HumanEval/0-9), the plain draft elsewhere (int8 kernels
# are CPU-only).
DEFAULT_CHOICE = {"cpu": ("draft-int8", 2), "other": ("draft", 2)}
PROPOSERS = ("draft", "draft-int8", "lookup", "none")


@dataclass(frozen=True)
class Setup:
    """What a measured recommendation depends on."""

    target: str
    draft: str
    dtype: str
    device: str
    machine: str  # processor or GPU name, and the thread count on a CPU

    @classmethod
    def from_args(cls, args) -> Setup:
        """The setup of a command's --target/--draft/--draft-vocab/--dtype/--device on this machine."""
        from .measure import device_name
        from .models import resolve_dtype

        machine = device_name(args.device)
        if not args.device.startswith("cuda"):
            machine += f", {torch.get_num_threads()} threads"
        draft = args.draft + (f" (head of {args.draft_vocab} ids)" if args.draft_vocab else "")
        return cls(args.target, draft, resolve_dtype(args.dtype, args.device), args.device, machine)


@dataclass(frozen=True)
class Choice:
    proposer: str  # one of PROPOSERS
    k: int
    why: str


def advice_dir() -> Path:
    """Saved advice lives next to the converted models (SPECDEC_CACHE or ~/.cache/specdec)."""
    from .models import cache_root

    return cache_root() / "advice"


def advice_path(setup: Setup) -> Path:
    key = hashlib.sha256(json.dumps(asdict(setup), sort_keys=True).encode()).hexdigest()[:16]
    return advice_dir() / f"{key}.json"


def save_advice(setup: Setup, report: dict) -> Path:
    """Keep the recommendation of an advise report (written atomically); returns the file."""
    from .bench.store import write_json_atomic

    path = advice_path(setup)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {
            "setup": asdict(setup), "choice": report["choice"], "context": report["settings"]["context"],
            "saved": time.strftime("%Y-%m-%d %H:%M"),
        })
    except OSError as e:
        raise SpecdecError(f"cannot save the advice to {path} ({e.strerror}); set SPECDEC_CACHE to a writable folder") from None
    return path


def choose(setup: Setup) -> Choice:
    """The saved advice for `setup`, else the device's default."""
    path = advice_path(setup)
    if not path.is_file():
        proposer, k = DEFAULT_CHOICE["cpu" if setup.device == "cpu" else "other"]
        return Choice(proposer, k, "no advice measured for this setup yet, so the default; "
                                   "`specdec advise` (same --target/--draft/--dtype) measures it")
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        choice = saved["choice"]
        proposer, k = choice["proposer"], int(choice["k"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecdecError(f"the saved advice {path} is unreadable ({e}): delete it or run `specdec advise` again") from None
    if proposer not in PROPOSERS:
        raise SpecdecError(f"the saved advice {path} names an unknown proposer {proposer!r}: run `specdec advise` again")
    return Choice(proposer, k, f"advised {saved.get('saved', '?')} at context {saved.get('context', '?')}: "
                               f"predicted {choice.get('predicted_speedup', 1.0):.2f}x")
