"""A thin runtime over llama.cpp (llama-cpp-python) for the registry's GGUF files: the reference
that specdec's own numbers are compared with on a CPU.

Why it exists: llama.cpp runs the quantized GGUF itself (Q4_K_M for the Qwen target), so its
plain decoding is the speed a user gets without specdec; its prompt-lookup speculation is the
other side of "does speculation pay here"; its perplexity on the same text is what the
quantization costs against the dequantized weights transformers runs.

Everything is fed token ids from the HF tokenizer, so both engines see the same prompt (their
tokenizers agree on the chat-templated prompts tested in tests/test_llamacpp.py, but ids leave
no room for a difference). Timing follows specdec.bench.execute: prefill_s runs up to the first
new token, decode_s is the rest, tokens_per_s = (new tokens - 1) / decode_s.

llama-cpp-python has no draft-model speculation: its `draft_model` hook takes any callable
that returns guessed token ids, and the only one it ships is prompt lookup
(LlamaPromptLookupDecoding). llama.cpp's draft-model mode lives in its C++ tools
(llama-speculative, llama-server --model-draft), which this build leaves out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import SpecdecError

if TYPE_CHECKING:
    from llama_cpp import Llama
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Generation:
    """One greedy generation, timed as specdec's benchmark times its own rows."""

    new_tokens: list[int]
    finish_reason: str  # "eos" (the last new token is an end token) or "length"
    prefill_s: float
    decode_s: float

    @property
    def decode_tokens(self) -> int:
        return max(len(self.new_tokens) - 1, 0)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens > 0 and self.decode_s > 0 else None


def load(
    gguf: str | Path,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    logits_all: bool = False,
    lookup: tuple[int, int] | None = None,
) -> Llama:
    """A llama.cpp model on the CPU. `n_threads` defaults to torch's thread count, so both engines
    get the same cores. `logits_all` keeps every position's logits (perplexity needs them).
    `lookup=(k, max_ngram)` turns on llama-cpp-python's prompt-lookup speculation: up to k
    guessed tokens per step from the longest n-gram match (n <= max_ngram) in the text so far;
    it forces logits_all, since each guess is checked against its own position's logits."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as err:
        raise SpecdecError("llama.cpp is not installed: run bash scripts/setup_llamacpp.sh") from err
    if n_threads is None:
        import torch

        n_threads = torch.get_num_threads()
    draft = LlamaPromptLookupDecoding(max_ngram_size=lookup[1], num_pred_tokens=lookup[0]) if lookup else None
    return Llama(
        model_path=str(gguf), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
        logits_all=logits_all, draft_model=draft, verbose=False,
    )


def end_tokens(llm: Llama) -> set[int]:
    """The ids llama.cpp's vocabulary marks as ending generation (EOS, EOT, ...)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return {t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}


def tokenize(llm: Llama, text: str) -> list[int]:
    """llama.cpp's ids for `text` with special tokens parsed and no BOS added, to compare with
    the HF tokenizer on an already templated prompt."""
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def generate(
    llm: Llama, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] | None = None
) -> Generation:
    """Greedy decoding from `prompt_ids` (a fresh prefill: nothing cached from an earlier call
    is reused) until an end token (kept, as specdec keeps it) or `max_new_tokens`."""
    if max_new_tokens < 1:
        raise SpecdecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt_ids) + max_new_tokens > llm.n_ctx():
        raise SpecdecError(f"{len(prompt_ids)} prompt + {max_new_tokens} new tokens exceed n_ctx {llm.n_ctx()}")
    eos = set(eos_ids) if eos_ids is not None else end_tokens(llm)
    llm.reset()  # with n_tokens = 0 generate() clears the KV cache and evaluates the whole prompt
    new: list[int] = []
    finish = "length"
    start = time.perf_counter()
    first = start
    for token in llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, reset=True):
        if not new:
            first = time.perf_counter()
        new.append(int(token))
        if token in eos:
            finish = "eos"
            break
        if len(new) >= max_new_tokens:
            break
    end = time.perf_counter()
    return Generation(new, finish, first - start, end - first)


def windows(n_tokens: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, first_scored) per window, the sliding-window perplexity of Hugging Face's
    "Perplexity of fixed-length models": windows of `window` tokens start every `stride`, each
    scores only the tokens after the previous window's end, with window - stride tokens of
    context at least (past the first window). With stride < window every token from position 1
    on is scored exactly once; with stride == window a window's first token is not scored (no
    context inside its window), as in that recipe. Token 0 is never scored."""
    if not 0 < stride <= window:
        raise SpecdecError(f"need 0 < stride <= window, got stride {stride}, window {window}")
    prev_end = 0
    for begin in range(0, max(n_tokens - 1, 0), stride):
        end = min(begin + window, n_tokens)
        yield begin, end, max(prev_end, begin + 1)
        prev_end = end
        if end == n_tokens:
            break


@dataclass(frozen=True)
class NLL:
    """Summed negative log-likelihood (nats) over `n_scored` tokens."""

    total: float
    n_scored: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.total / self.n_scored)


def nll(llm: Llama, ids: Sequence[int], window: int = 2048, stride: int = 1024, progress: bool = False) -> NLL:
    """Token-level NLL of `ids` with llama.cpp's logits over windows(): each window is a fresh
    sequence (no BOS added, unlike llama.cpp's own perplexity tool, so the tokens are exactly
    those transformers_nll scores). Needs a model loaded with logits_all and n_ctx >= window."""
    if not llm._logits_all:  # llama-cpp-python keeps no public flag for it
        raise SpecdecError("nll needs a model loaded with logits_all=True")
    if window > llm.n_ctx():
        raise SpecdecError(f"window {window} exceeds the model's n_ctx {llm.n_ctx()}")
    ids = list(ids)
    total, count = 0.0, 0
    for begin, end, first in _windows_shown(len(ids), window, stride, progress):
        llm.reset()
        llm.eval(ids[begin:end])
        # Row r of the scores predicts the token at begin + r + 1.
        rows = llm.scores[first - 1 - begin : end - 1 - begin]
        total += _nll_of_rows(rows, ids[first:end])
        count += end - first
    return NLL(total, count)


def transformers_nll(
    model: PreTrainedModel, ids: Sequence[int], window: int = 2048, stride: int = 1024, progress: bool = False
) -> NLL:
    """The same NLL with a transformers model, window by window, float32 log-softmax: the
    comparable figure for the dequantized weights."""
    import torch

    ids = list(ids)
    total, count = 0.0, 0
    for begin, end, first in _windows_shown(len(ids), window, stride, progress):
        with torch.no_grad():
            logits = model(torch.tensor([ids[begin:end]], device=model.device)).logits[0]
        rows = logits[first - 1 - begin : end - 1 - begin].float().cpu().numpy()
        total += _nll_of_rows(rows, ids[first:end])
        count += end - first
    return NLL(total, count)


def _windows_shown(n_tokens: int, window: int, stride: int, progress: bool) -> Iterator[tuple[int, int, int]]:
    """windows(), with a progress bar on stderr if asked: 20K tokens take minutes on 2 cores."""
    from tqdm import tqdm

    plan = list(windows(n_tokens, window, stride))
    return iter(tqdm(plan, desc="windows", unit="window", disable=not progress))


def _nll_of_rows(rows: np.ndarray, targets: Sequence[int], chunk: int = 256) -> float:
    """Sum over rows of logsumexp(row) - row[target], in float64, a chunk of rows at a time (a
    row is 150K logits for Qwen: all 2048 at once in float64 would take 2.5 GB)."""
    total = 0.0
    targets_arr = np.asarray(targets)
    for i in range(0, len(rows), chunk):
        block = rows[i : i + chunk].astype(np.float64)
        peak = block.max(axis=1, keepdims=True)
        lse = np.log(np.exp(block - peak).sum(axis=1)) + peak[:, 0]
        total += float((lse - block[np.arange(len(block)), targets_arr[i : i + chunk]]).sum())
    return total
