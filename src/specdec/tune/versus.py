"""llama.cpp's plain decoding of the same GGUF, the number a CPU user compares advise's choice with.

Timed where llama-cpp-python is installed and the target is a registry model (whose GGUF is what
llama.cpp runs), on the calibration prompts' ids with the same number of new tokens, greedy, as
the bench method `llamacpp` runs it (specdec.external.llamacpp).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from .advice import Choice


def llamacpp_available(target_name: str) -> str | None:
    """Why llama.cpp is not timed here, or None when it is."""
    from ..gguf import is_gguf

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (bash scripts/setup_llamacpp.sh)"
    if not is_gguf(target_name):
        return "the target is a local folder: no GGUF of it to run"
    return None


def time_llamacpp(target_name: str, prompts: list[list[int]], tokens: int,
                  progress: Callable[[str], None] = lambda _: None) -> dict:
    """llama.cpp's decode tokens/s pooled over `prompts` (one discarded warm-up first)."""
    from ..external import llamacpp
    from ..gguf import gguf_path

    gguf = gguf_path(target_name)
    progress(f"llama.cpp plain decoding of {gguf.name} on {len(prompts)} prompts")
    llm = llamacpp.load(gguf, n_ctx=max(len(p) for p in prompts) + tokens + 8)
    llamacpp.generate(llm, prompts[0], 8)
    runs = [llamacpp.generate(llm, p, tokens) for p in prompts]
    seconds = sum(r.decode_s for r in runs)
    rate = sum(r.decode_tokens for r in runs) / seconds if seconds else 0.0
    return {"gguf": gguf.name, "tokens_per_s": rate, "prompts": len(prompts), "tokens": tokens}


def against_llamacpp(record: dict, plain_tokens_per_s: float, choice: Choice) -> dict:
    """The record with specdec's plain decoding and its choice as multiples of llama.cpp's rate
    (the choice at its measured speedup where confirmed, else its predicted one)."""
    if not record.get("tokens_per_s"):
        return record
    speedup = choice.measured_speedup or choice.predicted_speedup
    return record | {"plain_over_llamacpp": plain_tokens_per_s / record["tokens_per_s"],
                     "choice_over_llamacpp": plain_tokens_per_s * speedup / record["tokens_per_s"],
                     "choice_from": "measured" if choice.measured_speedup else "predicted"}
