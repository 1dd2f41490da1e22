"""Saved advice and what `--proposer auto` runs: advise keeps its record in the cache folder
(advice_dir), keyed by what the measurement depends on (`Setup`: models, dtype, device, processor
and thread count); `choose` reads it there, or falls back to the device's measured default
(DEFAULT_CHOICE) and says how to calibrate."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import SpecdecError
from ..files import cache_root
from ..methods.spec import Method, parse
from .advice import Advice, Choice, old_choice

# Without advice, the fastest setting measured per kind of device. A CPU where specdec's kernels
# have a vector path (avx512-vnni, avx2): the int4 draft in a hybrid at k=3 over the int4 target,
# 1.77x the int4 target's plain decoding and 1.51x llama.cpp's on HumanEval/0-19 (2-core AMD
# EPYC Zen 5, README "The fastest lossless CPU recipe", docs/quant.md). A CPU with the portable
# kernels only: the int8 draft with k=2 (docs/bench/README.md, a CPU without native bf16). Elsewhere
# the plain draft (int8 and int4 kernels are CPU-only). The draft's head restricted to 32768 ids
# where the vocabulary is larger (default_choice): on a 2-core Xeon that hybrid was advise's
# choice and 2.15x/1.83x llama.cpp pooled on code/chat against the full head's 1.70x/1.75x; on
# the Zen 5 the restricted-head draft beat the full-head hybrid on code (docs/generate.md).
DEFAULT_CHOICE = {"cpu-kernels": "hybrid:k=3:quant=int4:vocab=32768", "cpu": "draft:k=2:quant=int8",
                  "other": "draft:k=2"}


@dataclass(frozen=True)
class Setup:
    """What a measured recommendation depends on."""

    target: str
    draft: str
    dtype: str
    device: str
    machine: str  # processor or GPU name, and the thread count on a CPU

    @classmethod
    def create(cls, target: str, draft: str, dtype: str, device: str, vocab: int | None = None) -> Setup:
        """The setup of these models (the draft's head restricted to `vocab` ids) on this machine."""
        import torch

        from ..machine import device_name
        from ..models.load import resolve_dtype

        machine = device_name(device)
        if not device.startswith("cuda"):
            machine += f", {torch.get_num_threads()} threads"
        draft += f" (head of {vocab} ids)" if vocab else ""
        return cls(target, draft, resolve_dtype(dtype, device), device, machine)


def advice_dir() -> Path:
    """Saved advice lives next to the converted models (SPECDEC_CACHE or ~/.cache/specdec)."""
    return cache_root() / "advice"


def advice_path(setup: Setup) -> Path:
    key = hashlib.sha256(json.dumps(asdict(setup), sort_keys=True).encode()).hexdigest()[:16]
    return advice_dir() / f"{key}.json"


def save_advice(setup: Setup, advice: Advice) -> Path:
    """Keep an advise record for `setup` (written atomically); returns the file."""
    from ..files import write_json_atomic

    path = advice_path(setup)
    record = replace(advice, setup=asdict(setup))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record.to_json() | {"saved": time.strftime("%Y-%m-%d %H:%M")})
    except OSError as e:
        raise SpecdecError(f"cannot save the advice to {path} ({e.strerror}); set SPECDEC_CACHE to a writable folder") from None
    return path


def device_kind(device: str) -> str:
    """DEFAULT_CHOICE's key: a CPU with a vector path of specdec's kernels, another CPU, or not a CPU."""
    from ..models.target_form import FAST_PATHS, kernel_path

    if not str(device).startswith("cpu"):
        return "other"
    return "cpu-kernels" if kernel_path(device) in FAST_PATHS else "cpu"


def default_choice(device: str, vocabulary: int | None) -> Method:
    """The device's measured default; its restricted head only where the draft's vocabulary
    (None: unknown) has more ids than the head keeps."""
    method = parse(DEFAULT_CHOICE[device_kind(device)])
    if method.vocab and (vocabulary is None or vocabulary <= method.vocab):
        return replace(method, vocab=None)
    return method


# What advise gained over the device default where both ran on the same held-out prompts, and
# how long advise took on 2 cores (docs/results.md: the AMX Xeon's 8 chat prompts, 1.88x against
# 1.70x llama.cpp; advise 7 min 5 s to 12 min 27 s on the machines measured).
ADVISE_HINT = "; where measured it ran up to 1.1x faster than this default, and takes 7-13 minutes on 2 cores"


def _advise_hint_once() -> str:
    """ADVISE_HINT the first time a cache folder runs the default, nothing later (a marker file
    in the advice folder remembers; where it cannot be written, the hint is given every time)."""
    marker = advice_dir() / ".default-hint-shown"
    if marker.exists():
        return ""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
    return ADVISE_HINT


def choose(setup: Setup, vocabulary: Callable[[], int | None] = lambda: None) -> tuple[Method, str]:
    """The method the saved advice for `setup` recommends, else the device's default (for a
    draft of `vocabulary()` ids, asked only then: it may read the draft's config); and why."""
    path = advice_path(setup)
    if not path.is_file():
        kind = device_kind(setup.device)
        return default_choice(setup.device, vocabulary()), (f"no advice measured for this setup yet, so the measured default of a "
                                             f"{kind} device; `specdec advise` (same --target/--draft/--dtype) "
                                             f"measures it here{_advise_hint_once()}")
    try:
        saved: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if "version" not in saved and "proposer" in saved.get("choice", {}):  # saved before version 2
            choice = Choice(old_choice(saved["choice"]["proposer"], int(saved["choice"]["k"])),
                            saved["choice"].get("predicted_speedup", 1.0))
        else:
            choice = Advice.from_json(saved).choice
        method = parse(choice.method)
    except (OSError, ValueError, KeyError, TypeError, SpecdecError) as e:
        raise SpecdecError(f"the saved advice {path} is unreadable ({e}): delete it or run `specdec advise` again") from None
    context = (saved.get("settings") or {}).get("context", saved.get("context", "?"))
    measured = f", measured {choice.measured_speedup:.2f}x paired" if choice.measured_speedup else ""
    return method, f"advised {saved.get('saved', '?')} at context {context}: predicted {choice.predicted_speedup:.2f}x{measured}"
