"""What a LoadSpec runs, decided once before any weight loads, and why: the target's form
(`auto` resolved by specdec.models.target_form), the runtime the target runs on
(specdec.runtime.choose), and the method (`auto` resolved from saved advice or the device
default, specdec.tune.saved). `place` decides the first two, `resolve_method` the third, `check`
says in one line what no loader could honour; `choose` is place and resolve_method together."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..methods.spec import Method, resolve_auto
from ..models.target_form import TargetForm
from .spec import LoadSpec

if TYPE_CHECKING:  # the advice (and scipy) and torch are imported where they are needed
    from ..tune.advice import Advice
    from ..tune.saved import Setup


@dataclass(frozen=True)
class Choices:
    """The record of what runs: `form` the target's weights (quant and reason), `runtime` where
    the target runs ("native" or "hf"), `method` the spec's method with `auto` resolved and
    `auto_line` what auto chose and why (None where the spec named its method)."""

    spec: LoadSpec
    form: TargetForm
    runtime: str
    method: Method
    auto_line: str | None = None

    @property
    def why(self) -> str:
        """Why this method runs (generate --json's "why")."""
        return f"auto: {self.auto_line}" if self.auto_line else "as --proposer says"

    def record(self) -> dict:
        """How the target's weights are quantized and why, and the runtime it runs on, for configs
        and advice (machine.environment's "quant")."""
        from ..models.quant_options import describe

        group = self.spec.quant_group
        return {"target": describe(self.form.quant, group), "group": group, "target_reason": self.form.reason,
                "runtime": self.runtime}

    def setup(self, vocab: int | None) -> Setup:
        """What saved advice is keyed by: the target with its form and, on specdec's native runtime,
        that runtime (its costs are not the hf ones), and the draft with its head of `vocab` ids."""
        from ..tune.saved import Setup

        spec, quant = self.spec, self.record()["target"]
        target = spec.target if quant == "none" else f"{spec.target} ({quant})"
        target += ", native runtime" if self.runtime == "native" else ""
        return Setup.create(target, spec.draft, spec.dtype, spec.device, vocab)


def choose(spec: LoadSpec) -> Choices:
    """Everything decided, `auto` resolved: what bench, sweep and advise record and load."""
    return resolve_method(place(spec))


def place(spec: LoadSpec) -> Choices:
    """The target's form and runtime; the method as the spec names it (auto not yet resolved)."""
    from ..models.target_form import choose_form
    from ..runtime.choose import use_native

    form = choose_form(spec.target_quant, spec.target, spec.device)
    runtime = "native" if use_native(spec.runtime, spec.target, form.quant, spec.device) else "hf"
    return Choices(spec, form, runtime, spec.method)


def check(choices: Choices) -> None:
    """One-line errors for a spec no loader can honour, before anything slow: the target's form
    and group on its device, a draft form only specdec's native runtime runs (int3) where the draft
    would run on transformers' model, a target that is no model at all."""
    from ..models.load import check_name
    from ..models.quant_options import check_options
    from ..quant import NATIVE_ONLY
    from ..runtime.choose import use_native

    spec, method = choices.spec, choices.spec.method
    check_options(choices.form.quant, spec.quant_group, spec.device, spec.target)
    drafts = method.uses_draft or method.kind == "auto"  # auto passes its quant= to what it resolves to
    if (drafts and not method.is_hf and method.quant in NATIVE_ONLY
            and not use_native(spec.runtime, spec.draft, method.quant, spec.device)):
        check_options(method.quant, spec.quant_group, spec.device, spec.draft)  # raises
    check_name(spec.target)  # before auto reads (or assembles) the draft's GGUF


def resolve_method(choices: Choices) -> Choices:
    """`auto` replaced by what the saved advice (or the device default) chose, with auto's own
    options where that method takes them, and a line saying so; other methods as they are."""
    from ..methods.build import check_specdec
    from ..tune.saved import choose as advised

    spec = choices.spec
    if spec.method.kind == "auto":
        chosen, why = advised(choices.setup(spec.method.vocab), lambda: draft_vocabulary(spec),
                              lambda quant: draft_runs(spec, quant))
        resolved, dropped = resolve_auto(spec.method, chosen)
        shown = "plain decoding" if resolved.kind == "ar" else resolved.label
        unused = f"; {', '.join(dropped)} not applied" if dropped and resolved.kind != "ar" else ""
        choices = replace(choices, method=resolved, auto_line=f"{shown} ({why}){unused}")
    check_specdec(choices.method)  # another engine's method has no proposer: said before the models load
    return choices


def draft_runs(spec: LoadSpec, quant: str | None) -> bool:
    """Whether the spec's draft runs in the weight form `quant` where its runtime puts it (int3:
    only on specdec's native runtime)."""
    from ..errors import SpecdecError
    from ..quant import NATIVE_ONLY
    from ..runtime.choose import use_native

    if quant not in NATIVE_ONLY:
        return True
    try:
        return use_native(spec.runtime, spec.draft, quant, spec.device)
    except SpecdecError:  # runtime native and a draft it cannot run: the draft's loader says so later
        return False


def draft_vocabulary(spec: LoadSpec) -> int | None:
    """The vocabulary size of the spec's draft (a GGUF's metadata, a local folder's config), read
    without loading weights; None where there is no draft or no readable config (a hub id is not
    fetched for this)."""
    from pathlib import Path

    from ..gguf import gguf_path, is_gguf, prepared

    if is_gguf(spec.draft):
        return prepared(gguf_path(spec.draft))[1].config.vocab
    if not Path(spec.draft).is_dir():
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec.draft, trust_remote_code=spec.trust_remote_code).vocab_size
    except (OSError, ValueError):
        return None


def pay_advice(choices: Choices) -> Advice | None:
    """The advice whose cost terms pay=1 stops by: the spec's pay_rule file, else, where `auto`
    chose a method with pay=1, the saved advice that chose it; None otherwise."""
    from ..tune.advice import Advice
    from ..tune.saved import advice_path

    spec = choices.spec
    if spec.pay_rule:
        return Advice.load(spec.pay_rule)
    if spec.method.kind == "auto" and choices.method.pay:
        return Advice.load(advice_path(choices.setup(spec.method.vocab)))
    return None
