"""The models of a LoadSpec as its Choices place them: the target on its runtime with its
tokenizer, and the draft with the variants the methods run (specdec.methods.build.Drafts), each
loaded once. Loaders are looked up when called (tests serve tiny models in their place)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import SpecdecError
from ..methods.spec import Method
from .choose import Choices
from .spec import LoadSpec

Say = Callable[[str], None]  # where the lines that say what loads go


def load_target(choices: Choices, say: Say):
    """The target, quantized as its form says, on the runtime chosen for it: a native runtime
    (runtime.NativeLM) or a transformers model; and its tokenizer. Says its form and why first."""
    spec = choices.spec
    say(choices.form.line(spec.target))
    if choices.runtime == "native":
        from ..gguf import tokenizer_of
        from ..runtime import load_gguf

        return load_gguf(spec.target, choices.form.quant), tokenizer_of(spec.target)
    from ..models.load import load_model

    return load_model(spec.target, spec.dtype, spec.device, spec.trust_remote_code, choices.form.quant,
                      spec.quant_group)


def load_drafts(spec: LoadSpec, target, tokenizer, methods: list[Method], reuse_caches: bool = False):
    """The spec's draft, checked against the target's vocabulary, with the variants `methods` run
    built: on the native runtime where the spec's runtime puts them, else from one transformers
    model, which is loaded only if a variant needs it; nothing is loaded when no method drafts."""
    from ..methods.build import Drafts
    from ..models.load import check_same_vocab, load_model, load_tokenizer
    from ..runtime.choose import use_native

    drafting = [m for m in methods if m.uses_draft]
    if not drafting:
        return Drafts(None)
    if spec.draft == "none":
        raise SpecdecError(f"{drafting[0].label} needs a draft model: drop it or pass --draft")
    native = {m.draft_variant for m in drafting
              if not m.is_hf and use_native(spec.runtime, spec.draft, draft_quant(spec, m), spec.device)}
    draft = draft_tokenizer = None
    if any(m.draft_variant not in native for m in drafting):
        draft, draft_tokenizer = load_model(spec.draft, spec.dtype, spec.device, spec.trust_remote_code)
    if not check_gguf_pair(spec):  # a GGUF pair is judged by its metadata; else by the tokenizers, and
        # before the variants are made: a restricted head scores fewer ids by design
        check_same_vocab(tokenizer, draft_tokenizer or load_tokenizer(spec.draft, spec.trust_remote_code), target,
                         draft)
    drafts = Drafts(draft, tokenizer, reuse_caches, source=spec.draft, group=spec.quant_group, native=native)
    drafts.prepare(methods)
    return drafts


def check_gguf_pair(spec: LoadSpec) -> bool:
    """Where the target and the draft are both GGUF files (or registry names), refuse a draft of
    another tokenizer from their metadata (specdec.gguf.check_pair; cheap, so it is asked before
    any weight loads); whether they were both GGUF."""
    from ..gguf import check_pair, gguf_path, is_gguf, prepared

    if spec.draft == "none" or not (is_gguf(spec.target) and is_gguf(spec.draft)):
        return False
    check_pair(prepared(gguf_path(spec.target))[1], prepared(gguf_path(spec.draft))[1])
    return True


def store_draft(spec: LoadSpec, method: Method) -> None:
    """A native GGUF draft's weights read into the model cache before the target loads (a no-op
    once there): its first conversion then peaks alone, not beside a loaded target."""
    from ..runtime.choose import use_native

    quant = draft_quant(spec, method)
    if not method.is_hf and use_native(spec.runtime, spec.draft, quant, spec.device):
        from ..runtime.native.loader import store_gguf

        store_gguf(spec.draft, quant)


def draft_quant(spec: LoadSpec, method: Method) -> str:
    """The form a method's draft runs in: its quant=, or, without one, dense for a registry name or
    a folder and the file as it is (int4: its own blocks) for a GGUF file, which has no dense copy."""
    from ..gguf import is_gguf
    from ..registry import REGISTRY

    if method.quant:
        return method.quant
    return "int4" if spec.draft not in REGISTRY and is_gguf(spec.draft) else "none"
