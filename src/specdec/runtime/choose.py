"""Which runtime a model runs on: specdec's native decoder (runtime.native) or transformers' model
(runtime.hf); and the runtime a generation runs a model on (runtime_of).

`auto` takes the native runtime where it runs the model as asked (a GGUF file or a registry
model, whose GGUF it reads, int4 or int8 weights, on the CPU) and transformers' model everywhere
else (dense weights, GPUs, a local Hugging Face folder); `native` insists and says why it cannot; `hf`
keeps transformers' model (what hf-* bench methods and the comparison with transformers'
generate need)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SpecdecError
from .native import NATIVE_MODES

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .hf.causal_lm import CausalLM
    from .native.native_lm import NativeLM

RUNTIMES = ("auto", "native", "hf")


def use_native(runtime: str, name: str, quant: str, device: str) -> bool:
    """Whether `name` in `quant` on `device` runs on the native runtime under `--runtime runtime`."""
    if runtime not in RUNTIMES:
        raise SpecdecError(f"unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}")
    if runtime == "hf":
        return False
    problem = unfit(name, quant, device)
    if problem and runtime == "native":
        raise SpecdecError(f"--runtime native: {problem}; use --runtime hf (or auto)")
    return problem is None


def unfit(name: str, quant: str, device: str) -> str | None:
    """Why the native runtime cannot run this model as asked, None if it can."""
    from ..gguf import is_gguf

    if quant not in NATIVE_MODES:
        return "it runs int4 or int8 weights (--target-quant / --draft-quant int4 or int8; drafts also int3)"
    if not str(device).startswith("cpu"):
        return "it runs on the CPU"
    if not is_gguf(name):
        return f"it reads GGUF files (or registry models), not the Hugging Face folder {name}"
    return None


def runtime_of(target: PreTrainedModel | CausalLM | NativeLM, preallocate: bool = True) -> CausalLM | NativeLM:
    """The runtime (decode.interface.Runtime) a generation runs `target` on: a transformers model in
    a fresh runtime.hf CausalLM (`preallocate` False: transformers' concatenating cache, cat=1), a
    runtime as it is (it starts a fresh cache at its next prefill). A transformers model is told
    by being a torch module, so a native runtime never imports transformers' model classes."""
    import torch

    if isinstance(target, torch.nn.Module):  # a transformers model, not a Runtime
        from .hf.causal_lm import CausalLM

        return CausalLM(target, preallocate=preallocate)
    if not preallocate:
        raise SpecdecError("cat=1 measures transformers' concatenating KV cache: run it with --runtime hf")
    return target
