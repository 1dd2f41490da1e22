"""The quantization options a command takes, checked before anything slow runs, and how a form
is named; apart from the quantized models themselves (quant_cache) so that checking arguments
imports no model library."""

from __future__ import annotations

from ..errors import SpecdecError
from ..quant import MODES, NATIVE_ONLY
from ..quant.weights import INT4_GROUPS
from ..registry import REGISTRY

GGUF_GROUP = 32  # Q4_K blocks are groups of 32


def check_options(mode: str, group: int, device: str = "cpu", source: str | None = None) -> None:
    """One-line errors for quantization options no kernel (or source: a registry name's GGUF)
    can honour, before anything slow runs."""
    if mode in NATIVE_ONLY:
        raise SpecdecError(f"{mode} weights run on specdec's native runtime only: a registry draft on the CPU "
                           "with --runtime auto or native")
    if mode not in MODES:
        raise SpecdecError(f"unknown quantization {mode!r}; use one of: {', '.join(MODES)}")
    if group not in INT4_GROUPS:
        raise SpecdecError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, got {group}")
    if mode != "none" and not str(device).startswith("cpu"):
        raise SpecdecError(f"{mode} weights run on torch's CPU kernels: drop the quantization on {device}")
    if mode == "int4" and source in REGISTRY and group != GGUF_GROUP:
        raise SpecdecError(f"{source} is quantized from its GGUF, whose 4-bit blocks are groups of "
                           f"{GGUF_GROUP}: --quant-group {group} applies to Hugging Face folders only")


def describe(mode: str, group: int) -> str:
    """How a quantization is named in labels and configs: none, int8, int4-g32."""
    return f"int4-g{group}" if mode == "int4" else mode
