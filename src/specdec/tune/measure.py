"""Measuring the cost model's terms on this machine: C_T(1), C_D, C_V(k) at a given context,
the memory a decode step has to read, and the machine's copy bandwidth to compare it with.

Every timing forwards a block over a cache that holds the context, then trims the cache back,
so all blocks see the same context; the median of a few repeats after one discarded warm-up
resists the odd slow call (page faults, another process waking up).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..cost.kv import kv_cache_bytes_for_config
from ..runtime.hf.causal_lm import CausalLM
from ..runtime.hf.linear import BlockLinear
from ..machine import synchronize

# A decode step that reads memory at this share of the read bandwidth or more is bandwidth-bound:
# guesses then ride along almost free in a verify block.
BANDWIDTH_BOUND = 0.5


@dataclass(frozen=True)
class ModelCosts:
    """One model's measured step costs at one context length (seconds)."""

    context: int
    step: float  # one token: C_T(1) for the target, C_D for a draft
    blocks: dict[int, float]  # rows -> seconds of one forward over that many new tokens

    def verify(self, k: int) -> float:
        """C_V(k): the target scores the pending token plus k guesses, a block of k+1 rows."""
        return self.blocks[k + 1]

    def relative(self) -> dict[int, float]:
        """Block cost in units of one step (1.0 = as cheap as decoding one token)."""
        return {rows: t / self.step for rows, t in self.blocks.items()}


def time_blocks(lm: CausalLM, rows: Iterable[int], repeats: int) -> dict[int, float]:
    """Median seconds of one forward of each block size after the cached context.

    Sizes are interleaved (every size once per pass, `repeats` passes after a discarded warm-up
    pass), so a slow spell of the machine hits all sizes alike instead of inflating one of them:
    on a shared 2-core VM, timing each size's repeats back to back made C_T(1) at 2K context
    come out 50% above the step time measured in generation right after.
    """
    base = lm.length
    sizes = sorted(set(rows))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats + 1):
        for n in sizes:
            block = torch.arange(n, device=lm.device) % 1000 + 10
            synchronize(lm.device)
            start = time.perf_counter()
            lm.forward(block)
            synchronize(lm.device)
            times[n].append(time.perf_counter() - start)
            lm.trim(base)
    return {n: statistics.median(t[1:]) for n, t in times.items()}


def measure_model(lm: CausalLM, context_ids: torch.Tensor, rows: Iterable[int], repeats: int = 3,
                  reuse: bool = True) -> ModelCosts:
    """Step and block costs of `lm` with `context_ids` in its cache (prefilled here, reusing
    what the cache already holds of it)."""
    lm.prefill(context_ids, reuse=reuse)
    blocks = time_blocks(lm, {1, *rows}, repeats)
    return ModelCosts(lm.length, blocks[1], blocks)


def copy_bandwidth(megabytes: int = 512, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """Bytes per second the machine moves in a large tensor copy (read + write counted)."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _median_seconds(lambda: dst.copy_(src), repeats, src.device)


def read_bandwidth(megabytes: int = 1024, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """Bytes per second the machine reads from a large tensor (a max over it: no writes, little
    arithmetic), the ceiling of a decode step, which only reads weights and KV."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    return src.numel() * 4 / _median_seconds(lambda: src.amax(), repeats, src.device)


def _median_seconds(op, repeats: int, device: torch.device) -> float:
    """Median time of `op` over `repeats` runs after one discarded warm-up."""
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        op()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _model(x):
    """The transformers model behind a CausalLM; a model or another runtime as it is."""
    return x.model if isinstance(x, CausalLM) else x


def weight_bytes(model) -> int:
    """Bytes of the weights a decode step reads (each once). A runtime of specdec's own counts its
    packed weights itself; of a transformers model: the parameters but an input embedding that
    is not also the output layer, and the weights that specdec's packed and quantized linear
    layers (runtime.hf.linear) and torch's dynamic int8 ones hold outside them, as buffers
    or opaque packed tensors."""
    model = _model(model)
    if not isinstance(model, PreTrainedModel):
        return model.weight_bytes()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    if getattr(model.get_output_embeddings(), "weight", None) is not embedding:
        total -= embedding.numel() * embedding.element_size()  # a step reads one row of it
    for module in model.modules():
        if isinstance(module, BlockLinear):
            total += module.weight_bytes()
        elif isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            total += sum(t.numel() * t.element_size() for t in (module.weight(), module.bias()) if t is not None)
    return total


def kv_bytes(model, context: int) -> int:
    """The KV cache of `context` positions by the formula 2*L*n*H_kv*d_h*bytes (a runtime of
    specdec's own: by its cache's own element size)."""
    model = _model(model)
    if not isinstance(model, PreTrainedModel):
        return model.kv_bytes(context)
    return kv_cache_bytes_for_config(model.config, context, model.dtype.itemsize)


def measured_kv_bytes(lm, allocated: bool = False) -> int:
    """Bytes of the cache's keys and values at its positions (checks the formula), or with
    `allocated` the whole storage behind them, a preallocated layer's unused room included."""
    if not isinstance(lm, CausalLM):
        return lm.kv_bytes(None if allocated else lm.length)
    total = 0
    for layer in lm.cache.hf_cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.untyped_storage().nbytes() if allocated else tensor.numel() * tensor.element_size()
    return total


def decode_bytes(model, context: int) -> int:
    """Bytes one decode step must read at least: the weights and the KV cache of the context."""
    return weight_bytes(model) + kv_bytes(model, context)


def activation_dtype(model) -> str:
    """The dtype a model computes in, by name: a transformers model's own; specdec's native
    runtime computes in float32 over its Q4/Q8 weights."""
    return str(_model(model).dtype).removeprefix("torch.")


def bandwidth_verdict(step_bytes: int, c_target: float, read_bytes_per_s: float, copy_bytes_per_s: float,
                      verify: dict[int, float]) -> dict:
    """Is one decode step limited by memory bandwidth or by compute on this machine? A step only
    reads (weights, KV), so its rate is set against the measured read bandwidth, its roofline."""
    used = step_bytes / c_target
    share = used / read_bytes_per_s
    growth = verify.get(4, max(verify.values())) / c_target
    if share < BANDWIDTH_BOUND:
        bound = "compute"
    else:  # the step streams memory; whether blocks ride along depends on the compute left
        bound = "bandwidth" if growth < 1.5 else "mixed"
    return {"bytes_per_step": step_bytes, "bytes_per_s": used, "read_bytes_per_s": read_bytes_per_s,
            "share_of_read_bandwidth": share, "copy_bytes_per_s": copy_bytes_per_s,
            "verify4_over_step": growth, "bound": bound}
