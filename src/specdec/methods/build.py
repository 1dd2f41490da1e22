"""Method spec -> proposer: the one place where proposers and their draft models are built.

`Drafts` holds the draft model as loaded and the variants methods ask for (quantized, restricted
head: Method.draft_variant), each built once and before any of them runs: specdec repacks a
model's weights the first time it runs (runtime.hf.prepare), and a repacked model can be
deep-copied but no longer quantized or head-restricted. The variant that no other method needs
is made from the loaded model in place, so a single draft method costs no copy.

`build_proposer` makes the proposer of one method (None for plain decoding); a draft always runs
as a proposer does (CausalLM with invariant=False: logits in the model's dtype, no block
invariance check), in generate, check, bench, sweep and advise alike.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING


from ..decode.interface import Runtime
from ..decode.proposal import Proposer
from ..errors import SpecdecError
from ..proposers import DraftModel
from ..proposers.policy import AcceptanceSchedule, ConfidenceFloor, PayRule, Policy, combined
from .kinds import KINDS
from .spec import Method

if TYPE_CHECKING:  # a native draft needs none of transformers' model side (seconds at start-up)
    from transformers import PreTrainedModel

    from ..runtime.hf.causal_lm import CausalLM

Variant = tuple[str | None, int | None]  # (quant, vocab), as Method.draft_variant
PLAIN: Variant = (None, None)


class Drafts:
    """The draft model and its variants; `reuse_caches` keeps one CausalLM per variant (and
    cache layout) so that generations can reuse its prefilled prefix (specdec sweep)."""

    def __init__(self, model: PreTrainedModel | None, tokenizer=None, reuse_caches: bool = False,
                 source: str | None = None, group: int = 32, native: set[Variant] | frozenset = frozenset()):
        """`tokenizer` (the target's) is needed only for restricted heads (vocab=N); `source`
        (the registry name or folder the draft was loaded from) and `group` only for quantized
        variants (quant=int4: specdec.models.quant_cache; without a source the weights are
        rounded). `native`: the variants that run on specdec's native runtime, loaded from the
        registry draft `source`'s GGUF (the others are made from `model`)."""
        self.loaded, self.tokenizer, self.reuse_caches = model, tokenizer, reuse_caches
        self.source, self.group, self.native = source, group, set(native)
        self._natives: dict[Variant, Runtime] = {}
        self._variants: dict[Variant, PreTrainedModel] = {}
        self._lms: dict[tuple[Variant, bool], CausalLM] = {}
        self._consumed_by: Variant | None = None  # the variant made from the loaded model in place

    def prepare(self, methods: Iterable[Method]) -> None:
        """Build every variant these methods run, now, so a bad option fails before any run."""
        needed = list(dict.fromkeys(m.draft_variant for m in methods if m.uses_draft))
        for variant in needed:
            if variant in self.native and variant not in self._natives:
                self._natives[variant] = self._native(variant)
        needed = [v for v in needed if v not in self.native]
        if not needed:
            return
        if self.loaded is None:
            raise SpecdecError("these methods need a draft model: pass --draft NAME")
        new = [v for v in needed if v not in self._variants]
        keep_loaded = PLAIN in needed or PLAIN in self._variants  # the loaded model itself runs
        for i, variant in enumerate(new):
            self._variants[variant] = self._make(variant, in_place=i == len(new) - 1 and not keep_loaded)

    def model(self, variant: Variant) -> PreTrainedModel:
        if variant not in self._variants:
            self.prepare([Method("draft", quant=variant[0], vocab=variant[1])])
        return self._variants[variant]

    def held(self, variant: Variant) -> PreTrainedModel | Runtime:
        """What holds a variant's weights: its native runtime or its transformers model."""
        if variant in self.native:
            return self.lm(Method("draft", quant=variant[0], vocab=variant[1]))
        return self.model(variant)

    def lm(self, method: Method) -> Runtime:
        """The runtime a method's draft runs in: a native one (its cache restarts at each
        prefill), or a CausalLM with a fresh cache or the kept one."""
        if method.draft_variant in self.native:
            if method.cat:
                raise SpecdecError("cat=1 measures transformers' concatenating KV cache: run it with --runtime hf")
            if method.draft_variant not in self._natives:
                self.prepare([method])
            return self._natives[method.draft_variant]
        key = (method.draft_variant, method.cat)
        if key in self._lms:
            return self._lms[key]
        from ..runtime.hf.causal_lm import CausalLM

        lm = CausalLM(self.model(method.draft_variant), preallocate=not method.cat, invariant=False)
        if self.reuse_caches:
            self._lms[key] = lm
        return lm

    def _native(self, variant: Variant) -> Runtime:
        from ..runtime import load_gguf

        quant, vocab = variant
        head = None
        if vocab is not None:
            if self.tokenizer is None:
                raise SpecdecError("vocab=N counts token frequencies with the tokenizer: pass the target's tokenizer")
            from ..models.draft_head import frequent_head_ids

            head = frequent_head_ids(self.tokenizer, vocab, len(self.tokenizer))
        return load_gguf(self.source, quant or "int4", head_ids=head)  # a GGUF file's own blocks

    def _make(self, variant: Variant, in_place: bool) -> PreTrainedModel:
        from ..models.draft_head import restrict_to_frequent
        from ..models.draft_quant import quantize_draft

        if self._consumed_by is not None:  # the loaded model is a variant now: nothing to copy from
            made = Method("draft", quant=self._consumed_by[0], vocab=self._consumed_by[1]).label
            raise SpecdecError(f"the draft was made into {made} already: prepare every method at once")
        if variant == PLAIN:
            return self.loaded
        quant, vocab = variant
        model = self.loaded if in_place else copy.deepcopy(self.loaded)
        if in_place:
            self._consumed_by = variant
        if vocab is not None:  # restriction first: quantization replaces the head
            if self.tokenizer is None:
                raise SpecdecError("vocab=N counts token frequencies with the tokenizer: not with --random-weights")
            restrict_to_frequent(model, self.tokenizer, vocab)
        return quantize_draft(model, quant, self.source, self.group) if quant else model


def build_proposer(method: Method, drafts: Drafts | None = None, pay: PayRule | None = None) -> Proposer | None:
    """The proposer that runs `method` (None: plain decoding). `pay` is the cost model's rule of a
    method with pay=1 (from `--pay-rule FILE`: specdec.tune.advice.Advice.pay_rule)."""
    kind = KINDS[method.kind]
    check_specdec(method)
    if kind.build is None:  # auto: resolve it first
        raise SpecdecError(f"{method.label} has no specdec proposer")
    draft = None
    if kind.uses_draft:
        if drafts is None:
            raise SpecdecError(f"{method.label} needs a draft model: pass --draft NAME")
        draft = DraftModel(drafts.lm(method), method.k, policy_of(method, pay))
    return kind.build(method, draft)


def check_specdec(method: Method) -> None:
    """Refuse a method that another engine's own generation runs (transformers', llama.cpp's):
    only specdec bench runs those."""
    if method.external:
        raise SpecdecError(f"{method.label} has no specdec proposer: it is another engine's own generation, "
                           "run in specdec bench only")


def policy_of(method: Method, pay: PayRule | None = None) -> Policy:
    """The adaptive-k policy of a draft method's conf, pay and dyn options (all that are set)."""
    if method.pay and pay is None:
        raise SpecdecError(f"method {method.label} needs --pay-rule FILE (the JSON of `specdec advise --json`)")
    policies = [ConfidenceFloor(method.conf)] if method.conf else []
    policies += [pay] if method.pay else []
    policies += [AcceptanceSchedule(method.k)] if method.dyn else []
    return combined(policies)
