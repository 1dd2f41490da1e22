"""`load(spec)`: a LoadSpec's target, tokenizer and proposer, loaded as its Choices say, in the
order that keeps a bad spec to one line before any weight loads and a first conversion's memory
peak apart from the loaded target."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..methods.spec import Method
from .choose import Choices, check, pay_advice, place, resolve_method
from .models import Say, check_gguf_pair, load_drafts, load_target, store_draft
from .spec import LoadSpec

if TYPE_CHECKING:  # torch loads where a model does
    from ..decode.interface import Runtime
    from ..decode.proposal import Proposer


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Loaded:
    """What `load` made: `target` as loaded (a transformers model or a native runtime), its
    tokenizer, the proposer of the chosen method (None: plain decoding) and the Choices record."""

    target: Any
    tokenizer: Any
    proposer: Proposer | None
    choices: Choices

    @property
    def method(self) -> Method:
        """The method that runs (`auto` resolved)."""
        return self.choices.method

    def lm(self) -> Runtime:
        """The runtime a generation runs the target on, with a fresh cache (runtime.choose.runtime_of)."""
        from ..runtime.choose import runtime_of

        return runtime_of(self.target, preallocate=not self.method.cat)


def load(spec: LoadSpec, say: Say = to_stderr) -> Loaded:
    """The spec's models and proposer. `say` gets the lines that say what loads: the target's form
    and why, then (once the target is known to load) what `auto` chose."""
    from ..methods.build import build_proposer

    choices = place(spec)
    check(choices)  # every one-line error before anything slow
    choices = resolve_method(choices)
    advice = pay_advice(choices)
    method = choices.method
    if method.uses_draft and check_gguf_pair(spec):
        store_draft(spec, method)
    target, tokenizer = load_target(choices, say)
    if choices.auto_line:  # said once the target is known to load, so a bad name still gives a one-line error
        say(f"[specdec] auto: {choices.auto_line}")
    drafts = load_drafts(spec, target, tokenizer, [method])
    proposer = build_proposer(method, drafts, advice.rule_for(method) if advice else None)
    return Loaded(target, tokenizer, proposer, choices)
