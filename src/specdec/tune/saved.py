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

# Without advice, what advise chose on each kind of device measured (docs/results.md, "What
# `specdec generate` runs with no options"). A CPU where specdec's kernels have a vector path
# (avx512-vnni, avx2) runs the int3 draft with its head restricted to 32768 ids and a confidence
# floor of 0.6, at the k advise chose there: k=5 on the AMX Xeon (advise's choice with conf=0.6
# for its pay=1, which needs a saved rule; 1.46x/1.24x the former default on 8 held-out code/chat
# prompts, 2.97x/2.10x llama.cpp), k=4 on the Zen 5 (AVX-512 BF16, no AMX; advise's choice, issue
# 35), k=3 on the Ice Lake Xeon (AVX-512 VNNI without BF16; advise's choice, 2.93x llama.cpp).
# The kinds are told apart by those CPU flags; other CPUs of a kind were not measured. A CPU with
# the portable kernels only: the int8 draft with k=2 (docs/bench/README.md). Elsewhere the plain
# draft (int8, int4 and int3 kernels are CPU-only).
DEFAULT_CHOICE = {"cpu-amx": "draft:k=5:quant=int3:vocab=32768:conf=0.6",
                  "cpu-bf16": "draft:k=4:quant=int3:vocab=32768:conf=0.6",
                  "cpu-kernels": "draft:k=3:quant=int3:vocab=32768:conf=0.6",
                  "cpu": "draft:k=2:quant=int8", "other": "draft:k=2"}
# Where the draft would not run on specdec's native runtime, which alone runs int3 (--runtime hf,
# a Hugging Face folder): the int4 hybrid, the default before the int3 draft (1.89x/1.70x
# llama.cpp on the AMX Xeon's held-out code/chat prompts, 2.00x/1.84x in the run above).
NOT_NATIVE_DEFAULT = "hybrid:k=3:quant=int4:vocab=32768"


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
    """DEFAULT_CHOICE's key: a CPU with a vector path of specdec's kernels (by AMX, else AVX-512
    BF16, else neither), another CPU, or not a CPU."""
    from ..machine import cpu_flags
    from ..models.target_form import FAST_PATHS, kernel_path

    if not str(device).startswith("cpu"):
        return "other"
    if kernel_path(device) not in FAST_PATHS:
        return "cpu"
    flags = cpu_flags()
    return "cpu-amx" if "amx_tile" in flags else "cpu-bf16" if "avx512_bf16" in flags else "cpu-kernels"


def default_choice(device: str, vocabulary: int | None, runs: Callable[[str | None], bool] | None = None) -> Method:
    """The device's measured default; the int4 hybrid instead where its draft form does not run
    (`runs(quant)` False: int3 where the draft is not on the native runtime; without `runs`,
    only the forms every runtime runs); its restricted head only where the draft's vocabulary
    (None: unknown) has more ids than the head keeps."""
    from ..quant import NATIVE_ONLY

    runs = runs or (lambda quant: quant not in NATIVE_ONLY)
    method = parse(DEFAULT_CHOICE[device_kind(device)])
    if not runs(method.quant):
        method = parse(NOT_NATIVE_DEFAULT)
    if method.vocab and (vocabulary is None or vocabulary <= method.vocab):
        return replace(method, vocab=None)
    return method


# What advise gained over the device default where both ran on the same held-out prompts, and
# how long advise took on 2 cores (docs/results.md: on the AMX Xeon advise's pay=1 choice against
# this default, 1.00x median on 8 code and on 8 chat prompts; on the Zen 5 and the Ice Lake the
# default is advise's choice; advise 5 min 7 s to 12 min 27 s on the machines measured).
ADVISE_HINT = ("; on the CPUs measured its choice ran within 1% of this default, on another CPU it may "
               "differ; it takes 5-13 minutes on 2 cores")


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


def choose(setup: Setup, vocabulary: Callable[[], int | None] = lambda: None,
           runs: Callable[[str | None], bool] | None = None) -> tuple[Method, str]:
    """The method the saved advice for `setup` recommends, else the device's default (for a
    draft of `vocabulary()` ids, asked only then: it may read the draft's config; `runs` as in
    default_choice); and why."""
    path = advice_path(setup)
    if not path.is_file():
        kind = device_kind(setup.device)
        return default_choice(setup.device, vocabulary(), runs), (f"no advice measured for this setup yet, so the measured default of a "
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
