"""One generation of one method on one prompt, timed: specdec's engine, transformers' generate(),
or llama.cpp's greedy decoding of the target's GGUF (specdec.external.llamacpp, same prompt token
ids), each measured into a bench.row.Measured. For HF methods the streamer's chunk sizes give
the tokens committed per target call (`round_tokens`), and forward hooks count the model calls;
llama.cpp's rows carry the outputs and times only.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation import BaseStreamer

from ..decode.engine import generate
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError
from ..external import llamacpp
from ..external.hf import generation_config
from ..runtime.choose import runtime_of
from ..runtime.hf.model_facts import is_prepared
from ..machine import PeakMemory, synchronize
from ..methods.build import Drafts, build_proposer, policy_of
from ..methods.spec import Method
from ..proposers.policy import PayRule
from ..tune.advice import Advice
from .row import Measured

# Tokens of the discarded warm-up generation: enough to run prefill and a few rounds of every
# code path (first calls pay for allocation and thread start-up), short enough to cost little.
WARMUP_TOKENS = 16
LLAMACPP_CONTEXT = 8192  # llama.cpp's n_ctx: prompt + new tokens must fit


@dataclass(frozen=True)
class RunSettings:
    max_new_tokens: int
    sampling: SamplingConfig
    seed: int | None  # the seed of repeat r is seed + r; None: a fresh random seed every run
    eos_token_ids: tuple[int, ...]  # passed explicitly to both engines so they stop alike (engine.eos_token_ids)


class Executor:
    """Runs methods on one target and the draft variants of `drafts`, with fixed settings."""

    def __init__(
        self, target: PreTrainedModel, drafts: Drafts, settings: RunSettings, memory: PeakMemory,
        auto: Method | None = None, advice: Advice | None = None, target_name: str | None = None,
    ):
        """`auto` is the method the `auto` method stands for here (resolved by the caller);
        `advice` gives the cost terms of methods with pay=1 (--pay-rule FILE); `target_name`
        (a registry name) where llama.cpp methods run its GGUF."""
        self.target, self.drafts, self.settings, self.memory = target, drafts, settings, memory
        self.auto, self.advice, self.target_name = auto, advice, target_name
        self._stock: dict[int, PreTrainedModel] = {}  # id(model) -> its unmodified copy, for HF methods
        self._llamas: dict[Method, object] = {}

    def prepare(self, methods: list[Method]) -> None:
        """Build the draft variants and pay rules the methods need now, so a bad option fails
        before any run."""
        resolved = [self._resolved(m) for m in methods]
        self.drafts.prepare(resolved)
        # transformers' generate runs on copies made before specdec's first generation repacks the
        # models in place, so hf-* rows measure stock transformers (at the cost of their memory).
        hf = [m for m in resolved if m.is_hf]
        if hf:
            self._unmodified(self.target)
        for m in hf:
            if m.kind == "hf-assisted":
                self._unmodified(self.drafts.model(m.draft_variant))
        for m in resolved:
            if m.pay:
                policy_of(m, self._pay_rule(m))  # a missing or unfit --pay-rule fails here
        llama_methods = [m for m in resolved if m.is_llamacpp]
        if llama_methods:
            check_llamacpp(llama_methods, self.target_name, self.settings.sampling)
            from ..gguf import gguf_path

            gguf = gguf_path(self.target_name)
            for m in llama_methods:
                lookup = (m.k, m.ngram) if m.kind == "llamacpp-lookup" else None
                self._llamas[m] = llamacpp.load(gguf, n_ctx=LLAMACPP_CONTEXT, lookup=lookup)

    def _pay_rule(self, method: Method) -> PayRule | None:
        return self.advice.rule_for(method) if self.advice else None

    def _unmodified(self, model: PreTrainedModel) -> PreTrainedModel:
        """The copy of `model` as loaded that transformers' methods run on, made on first use."""
        if not isinstance(model, PreTrainedModel):
            raise SpecdecError("transformers' methods (hf-*) run transformers' own model: pass --runtime hf")
        if id(model) not in self._stock:
            if is_prepared(model):
                raise SpecdecError("transformers' methods need the models as loaded, before any specdec "
                                   "generation repacks them: call Executor.prepare before running")
            self._stock[id(model)] = copy.deepcopy(model)
        return self._stock[id(model)]

    def run(self, method: Method, prompt_ids: list[int], repeat: int) -> Measured:
        """The measurements of one row."""
        seed = None if self.settings.seed is None else self.settings.seed + repeat
        self.memory.reset()
        row = self._generate(method, prompt_ids, seed, self.settings.max_new_tokens)
        row.peak_memory_bytes = self.memory.read()
        return row

    def warm_up(self, method: Method, prompt_ids: list[int]) -> None:
        self._generate(method, prompt_ids, self.settings.seed, min(WARMUP_TOKENS, self.settings.max_new_tokens))

    def _generate(self, method: Method, prompt_ids: list[int], seed: int | None, max_new_tokens: int) -> Measured:
        method = self._resolved(method)
        runs = {"specdec": self._run_specdec, "hf": self._run_hf, "llamacpp": self._run_llamacpp}
        if method.runner not in runs:
            raise SpecdecError(f"{method.label} is not run by this executor")
        return runs[method.runner](method, prompt_ids, seed, max_new_tokens)

    def _resolved(self, method: Method) -> Method:
        return self.auto if method.kind == "auto" else method

    def _run_specdec(self, method: Method, prompt_ids: list[int], seed: int | None, max_new_tokens: int) -> Measured:
        s = self.settings.sampling
        result = generate(
            runtime_of(self.target, preallocate=not method.cat), prompt_ids,
            drafter=build_proposer(method, self.drafts, self._pay_rule(method)), max_new_tokens=max_new_tokens,
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=seed,
            eos_token_id=list(self.settings.eos_token_ids),
        )
        st, new = result.stats, result.new_tokens
        return Measured(new, len(new), result.finish_reason, st.prefill_seconds, st.decode_seconds, st.decode_tokens,
                        dict(st.times), stats=st)

    def _run_hf(self, method: Method, prompt_ids: list[int], seed: int | None, max_new_tokens: int) -> Measured:
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.target.device)
        extra = self._hf_method_kwargs(method)
        clock = _TokenClock(lambda: synchronize(self.target.device))
        if seed is not None:
            torch.manual_seed(seed)
        draft = extra.get("assistant_model")
        target = self._unmodified(self.target)
        with _count_calls(target) as target_calls, _count_calls(draft) as draft_calls:
            clock.start()
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=self._hf_config(method, max_new_tokens),
                streamer=clock, **extra,
            )
            clock.stop()
        new = out[0, ids.shape[1]:].tolist()
        eos = set(self.settings.eos_token_ids)
        finish = "eos" if new and new[-1] in eos else "length"
        return Measured(new, len(new), finish, clock.prefill_s, clock.decode_s, len(new) - clock.chunks[0],
                        {"prefill": clock.prefill_s, "decode": clock.decode_s}, rounds=len(clock.chunks) - 1,
                        round_tokens=clock.chunks, target_calls=target_calls[0], draft_calls=draft_calls[0])

    def _run_llamacpp(self, method: Method, prompt_ids: list[int], seed: int | None, max_new_tokens: int) -> Measured:
        if method not in self._llamas:
            self.prepare([method])
        out = llamacpp.generate(self._llamas[method], prompt_ids, max_new_tokens, self.settings.eos_token_ids)
        # llama.cpp's generator hands out one token at a time, guessed or not: no rounds.
        return Measured(out.new_tokens, len(out.new_tokens), out.finish_reason, out.prefill_s, out.decode_s,
                        out.decode_tokens, {"prefill": out.prefill_s, "decode": out.decode_s})

    def _hf_config(self, method: Method, max_new_tokens: int) -> GenerationConfig:
        lookup = dict(prompt_lookup_num_tokens=method.k, max_matching_ngram_size=method.ngram)
        return generation_config(max_new_tokens, self.settings.eos_token_ids, self.settings.sampling,
                                 **(lookup if method.kind == "hf-lookup" else {}))

    def _hf_method_kwargs(self, method: Method) -> dict:
        if method.kind != "hf-assisted":
            return {}
        # transformers (5.24) reads these from the assistant's own generation config, not from
        # generate()'s arguments; the confidence threshold (default 0.4) would end drafts early,
        # so it is switched off to propose exactly k tokens per round, as draft:k=K does.
        draft = self._unmodified(self.drafts.model(method.draft_variant))
        cfg = draft.generation_config
        cfg.num_assistant_tokens = method.k
        cfg.num_assistant_tokens_schedule = "constant"
        cfg.assistant_confidence_threshold = 0.0
        return {"assistant_model": draft}


def check_llamacpp(methods: list[Method], target_name: str | None, sampling: SamplingConfig) -> None:
    """One-line errors for llama.cpp methods it cannot run here (checked before models load)."""
    from ..gguf import is_gguf

    if not methods:
        return
    label = methods[0].label
    if target_name is None or not is_gguf(target_name):
        raise SpecdecError(f"{label} runs llama.cpp on the target's GGUF file, which only GGUF targets (a file or a "
                           f"registry name) have; not {target_name}")
    if not sampling.greedy:
        raise SpecdecError(f"{label} runs greedy decoding only: drop --temperature")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SpecdecError(f"{label} needs llama-cpp-python: run bash scripts/setup_llamacpp.sh") from None






class _TokenClock(BaseStreamer):
    """Times generate(): the first chunk of new tokens ends the prefill. generate() first puts the
    prompt, then each step's (or each speculative round's) committed tokens."""

    def __init__(self, sync):
        self._sync = sync
        self._prompt_seen = False
        self.chunks: list[int] = []

    def start(self) -> None:
        self._sync()
        self._t0 = self._first = time.perf_counter()

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if not self.chunks:
            self._sync()
            self._first = time.perf_counter()
        self.chunks.append(value.numel())

    def end(self) -> None:
        pass  # the clock stops in stop(), after generate() has returned its output

    def stop(self) -> None:
        self._sync()
        end = time.perf_counter()
        self.prefill_s, self.decode_s = self._first - self._t0, end - self._first


@contextmanager
def _count_calls(model: PreTrainedModel | None) -> Iterator[list[int]]:
    """Forward calls of `model` inside the block, in a one-element list filled as they happen."""
    count = [0]
    if model is None:
        yield count
        return
    handle = model.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        yield count
    finally:
        handle.remove()
