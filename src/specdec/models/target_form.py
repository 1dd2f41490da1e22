"""Which lossless form of the target runs: `--target-quant auto` resolved, with its reason.

A registry model ships as a Q4_K_M GGUF: its 4-bit form (Q4_K/Q6_K kept exactly, specdec.quant)
*is* the model as shipped, and the dense copy is its dequantization, read at about 3x the bytes.
On a CPU where specdec's kernels have a vector path (avx512-vnni or avx2) the 4-bit form decodes
faster (docs/quant.md: the int4 target's plain decoding at about 2x the dense bf16 copy on the
2-core Zen 5); on a GPU, or a CPU with only the portable kernels, the dense copy is the faster
form. A local folder ships dense, so auto keeps it dense: rounding it would change the model.
An explicit none, int8 or int4 always wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quant import MODES

AUTO = "auto"
TARGET_FORMS = (AUTO, *MODES)  # --target-quant's choices
FAST_PATHS = ("avx512-vnni", "avx2")  # kernels' vector paths on which the 4-bit form is the faster


@dataclass(frozen=True)
class TargetForm:
    quant: str  # one of MODES
    reason: str

    def line(self, target: str) -> str:
        """The stderr line every command prints."""
        form = "dense" if self.quant == "none" else self.quant
        return f"[specdec] target {target}: {form} ({self.reason})"


def kernel_path(device: str) -> str | None:
    """The kernels' vector path where they run (a CPU), else None; a module function so tests
    can pretend another CPU."""
    if not str(device).startswith("cpu"):
        return None
    from ..kernels import vector_path

    return vector_path()


def choose_form(requested: str, target: str, device: str) -> TargetForm:
    """The form `--target-quant requested` runs for this target on this device."""
    from ..gguf import is_gguf
    from ..registry import REGISTRY

    if requested != AUTO:
        return TargetForm(requested, "as --target-quant says")
    if not is_gguf(target):
        return TargetForm("none", "auto: a local folder ships dense weights; --target-quant int4 rounds them")
    if target not in REGISTRY:
        return TargetForm("int4", "auto: a GGUF file runs as it is, every block kept exactly, on specdec's native "
                                  "runtime")
    path = kernel_path(device)
    if path is None:
        return TargetForm("none", f"auto: on {device} the dense copy is the faster form (specdec's kernels are CPU-only)")
    if path not in FAST_PATHS:
        return TargetForm("none", f"auto: specdec's kernels have only their {path} path on this CPU, slower than dense")
    return TargetForm("int4", f"auto: {target} ships as Q4_K_M GGUF, its Q4 form is the model as shipped, and "
                              f"specdec's {path} kernels decode it faster than the dense copy")
