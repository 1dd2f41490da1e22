"""Method specs: one grammar for what every command runs.

    KIND[:OPTION=VALUE]...

    ar                          plain decoding (`none` is the same method)
    auto                        what `specdec advise` measured best here (specdec.tune.advice)
    auto:memory=1               the same, a draft chain with the memory of earlier requests (serve's)
    draft:k=4:quant=int8:vocab=32768:conf=0.7:width=2, draft:k=6:dyn=1
    lookup:k=8:ngram=3
    hybrid:k=2                  prompt lookup when an n-gram matches, else the draft
    hf-ar, hf-assisted:k=4, hf-lookup:k=4:ngram=3      transformers' own generate()
    llamacpp, llamacpp-lookup:k=10:ngram=2   llama.cpp on the target's GGUF (specdec.external.llamacpp)
    endpoint:name=spec          an OpenAI-compatible server given by bench's --endpoint spec=URL

A spec is parsed and checked once (`parse`): an option its kind does not take, or one that
contradicts another, is a one-line error naming it. `Method.label` is the canonical spelling:
every option the method runs with, in one order, so equal methods have equal labels. generate's
and check's flags (-k, --draft-int8, ...) and bench's, sweep's and advise's --draft-int8,
--draft-vocab and --max-ngram fold into the specs (`parse(..., flags)`), so each command runs
what one spec says. The kinds and their options are one table (specdec.methods.kinds);
specdec.methods.build turns a spec into a proposer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import SpecdecError
from .kinds import KINDS
from .options import OPTIONS

# Measured on the 2-core Xeon (docs/generate.md): a verify block of 2-3 rows (k <= 2) costs ~1.1
# target steps, 4-6 rows ~1.9, so k=2 pays best there.
DEFAULT_K = 2
DEFAULT_NGRAM = 3  # the longest n-gram prompt lookup matches


ALIASES = {"none": "ar"}
_DEFAULTS = {"k": DEFAULT_K, "ngram": DEFAULT_NGRAM}


@dataclass(frozen=True)
class Method:
    kind: str
    k: int | None = None
    ngram: int | None = None
    quant: str | None = None  # None: the draft's own weights
    vocab: int | None = None  # None: the draft scores every token id
    conf: float | None = None
    pay: bool = False
    dyn: bool = False
    width: int | None = None  # None: a chain
    cat: bool = False
    name: str | None = None  # an endpoint's
    memory: bool | None = None  # auto's: None, not given (specdec serve then says 1)

    @property
    def label(self) -> str:
        """The canonical spec: every option the method runs with, in OPTIONS order."""
        parts = [self.kind]
        for name in OPTIONS:
            value = getattr(self, name)
            if value is not None and value is not False:
                parts.append(f"{name}={_spell(value)}")
        return ":".join(parts)

    def __str__(self) -> str:
        return self.label

    @property
    def runner(self) -> str:
        """Who generates its tokens (specdec.methods.kinds.RUNNERS)."""
        return KINDS[self.kind].runner

    @property
    def is_hf(self) -> bool:
        return self.runner == "hf"

    @property
    def is_llamacpp(self) -> bool:
        return self.runner == "llamacpp"

    @property
    def is_endpoint(self) -> bool:
        return self.runner == "endpoint"

    @property
    def external(self) -> bool:
        """Another engine's own generation runs it (transformers', llama.cpp's, a server's): bench only."""
        return self.runner in ("hf", "llamacpp", "endpoint")

    @property
    def speculative(self) -> bool:
        """One of specdec's proposers runs (not plain decoding, not transformers')."""
        return self.runner == "specdec" and self.kind != "ar"

    @property
    def uses_draft(self) -> bool:
        """The draft model runs."""
        return KINDS[self.kind].uses_draft

    @property
    def draft_variant(self) -> tuple[str | None, int | None]:
        """Which copy of the draft it runs: (quant, vocab)."""
        return self.quant, self.vocab

    def family(self) -> Method:
        """The method without its round options (k, conf, pay, dyn, width, cat): what a draft variant
        or a proposer is called in an advice record."""
        return Method(self.kind, ngram=self.ngram, quant=self.quant, vocab=self.vocab)


# option -> (the flag that sets it, its value as written on the command line; None: not given)
Flags = Mapping[str, tuple[str, str | None]]


def parse(text: str, flags: Flags | None = None) -> Method:
    """One spec, with the values of flags folded in (each must apply to it)."""
    kind, given = _read(text)
    for option, (flag, value) in _flag_values(flags).items():
        if option not in KINDS[kind].options:
            raise SpecdecError(f"{flag} does not apply to {text}: {_takes(kind)}")
        _fold(text, given, option, flag, value)
    return _complete(text, kind, given)


def parse_list(text: str, flags: Flags | None = None, where: str = "--methods") -> list[Method]:
    """A comma list of specs; each flag applies to the methods that take its option and must
    apply to one of them at least."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise SpecdecError(f"{where} has an empty entry: {text!r}")
    read = [(part, *_read(part)) for part in parts]
    for option, (flag, value) in _flag_values(flags).items():
        takers = [(part, given) for part, kind, given in read if option in KINDS[kind].options]
        if not takers:
            raise SpecdecError(f"{flag} applies to no method in {where} {text!r}")
        for part, given in takers:
            _fold(part, given, option, flag, value)
    methods = [_complete(part, kind, given) for part, kind, given in read]
    labels = [m.label for m in methods]
    twice = next((label for label in labels if labels.count(label) > 1), None)
    if twice:
        raise SpecdecError(f"{where} lists {twice} twice")
    return methods


def resolve_auto(auto: Method, chosen: Method) -> tuple[Method, list[str]]:
    """The method `auto` runs: the chosen one with auto's options where it takes them, and with
    the memory where auto's memory=1 and it is a draft chain (remembering); returns it and the
    options it does not take (none apply to plain decoding)."""
    mine = {name: getattr(auto, name) for name in OPTIONS if name != "memory"}
    mine = {name: value for name, value in mine.items() if value is not None and value is not False}
    taken = {name: value for name, value in mine.items() if name in KINDS[chosen.kind].options}
    resolved = replace(chosen, **taken)
    _check(resolved.label, resolved)
    dropped = [f"{name}={_spell(value)}" for name, value in mine.items() if name not in taken]
    return (remembering(resolved) if auto.memory else resolved), dropped


def remembering(method: Method) -> Method:
    """A draft chain as suffix+draft with the same draft and round options (the memory's
    confident guesses, else the draft's: where a server's requests repeat what it saw, as
    conversations do); any other method as it is (plain decoding, model-free, a tree, the
    lookup hybrid)."""
    if method.kind != "draft" or method.width:
        return method
    return Method("suffix+draft", k=method.k, quant=method.quant, vocab=method.vocab, conf=method.conf,
                  pay=method.pay, dyn=method.dyn, cat=method.cat)


def in_conversation(method: Method) -> Method:
    """The method a conversation runs (`specdec serve`, `specdec chat`): `auto` remembers the
    earlier requests and turns unless auto:memory=0 says not, so the draft chain it picks runs as
    suffix+draft (remembering) and a turn that repeats what was seen is guessed from it
    (docs/conversations.md); any other method as named."""
    return replace(method, memory=True) if method.kind == "auto" and method.memory is None else method


def legacy(entry: Mapping[str, Any]) -> Method:
    """A method as configs before the one grammar wrote it ({"label", "kind", "k", ...}, the
    int8 draft as kind draft-int8, conf in percent): committed runs stay readable."""
    kind = entry["kind"]
    values = {name: entry.get(name) for name in ("k", "ngram", "vocab", "width")}
    return Method("draft" if kind == "draft-int8" else kind, **values,
                  quant="int8" if kind == "draft-int8" else None,
                  conf=entry["conf"] / 100 if entry.get("conf") else None,
                  pay=bool(entry.get("pay")), cat=bool(entry.get("cat")))


def _read(text: str) -> tuple[str, dict[str, Any]]:
    kind, *options = text.strip().split(":")
    kind = ALIASES.get(kind, kind)
    if kind == "draft-int8":
        raise SpecdecError(f"{text!r}: the int8 draft is written draft:quant=int8 now")
    if kind not in KINDS:
        raise SpecdecError(f"unknown method {kind!r} in {text!r}; use: {', '.join(KINDS)}")
    given: dict[str, Any] = {}
    for option in options:
        name, sep, raw = option.partition("=")
        if not sep or name not in KINDS[kind].options:
            raise SpecdecError(f"bad option {option!r} in {text!r}; {_takes(kind)}")
        if name in given:
            raise SpecdecError(f"{name} is given twice in {text!r}")
        read, _ = OPTIONS[name]
        try:
            given[name] = read(raw)
        except ValueError as e:
            raise SpecdecError(f"{name} in {text!r} {e}, got {raw!r}") from None
    return kind, given


def _flag_values(flags: Flags | None) -> dict[str, tuple[str, Any]]:
    """The flags given, read as their options are (a flag that spells out the default, such as
    --tree-width 1, counts as not given)."""
    values = {}
    for option, (flag, raw) in (flags or {}).items():
        if raw is None:
            continue
        read, _ = OPTIONS[option]
        try:
            value = read(str(raw))
        except ValueError as e:
            raise SpecdecError(f"{flag} {e}, got {raw}") from None
        if value is not None:
            values[option] = (flag, value)
    return values


def _fold(text: str, given: dict[str, Any], option: str, flag: str, value: Any) -> None:
    if option in given and given[option] != value:
        raise SpecdecError(f"{flag} contradicts {option}={given[option]} in {text}")
    given[option] = value


def _complete(text: str, kind: str, given: dict[str, Any]) -> Method:
    defaults = {} if kind == "auto" else {o: v for o, v in _DEFAULTS.items() if o in KINDS[kind].options}
    method = Method(kind, **{**defaults, **given})
    _check(text, method)
    return method


def _check(text: str, m: Method) -> None:
    """Combinations no proposer can honour."""
    if m.kind == "endpoint" and m.name is None:
        raise SpecdecError(f"{text} needs name=NAME, the name of a bench --endpoint NAME=URL")
    if m.pay and m.width:
        raise SpecdecError(f"pay=1 does not apply to a tree (width={m.width}) in {text}: a tree's "
                           "chain stops on conf or dyn only")


def _spell(value: Any) -> str:
    if value is True:
        return "1"
    return format(value, "g") if isinstance(value, float) else str(value)


def _takes(kind: str) -> str:
    options = KINDS[kind].options
    return f"{kind} takes " + (", ".join(f"{o}=" for o in options) if options else "no options")
