"""The one table of method kinds: the options each takes, who generates its tokens, whether a
draft model runs, and, for specdec's own kinds, how its proposer is built from its spec and the
draft (already wrapped in a DraftModel with its k and policy, specdec.methods.build)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # proposers import torch; the grammar is read without it (bench report)
    from ..decode.proposal import Proposer
    from ..proposers import DraftModel


class Spec(Protocol):
    """What a builder reads of a method spec (specdec.methods.spec.Method)."""

    k: int | None
    ngram: int | None
    width: int | None

# Who generates a method's tokens: specdec's engine, transformers' generate(), llama.cpp, an
# OpenAI-compatible server, or `auto`, which is resolved to one of specdec's methods first.
RUNNERS = ("specdec", "hf", "llamacpp", "endpoint", "auto")

Builder = Callable[[Spec, "DraftModel | None"], "Proposer | None"]


@dataclass(frozen=True)
class Kind:
    options: tuple[str, ...]
    runner: str
    uses_draft: bool = False  # the draft model runs (its variant: the spec's quant and vocab)
    build: Builder | None = None  # specdec's kinds: the proposer (None for plain decoding)


def _plain(method: Spec, draft: DraftModel | None) -> None:
    return None


def _lookup(method: Spec, draft: DraftModel | None) -> Proposer:
    from ..proposers import PromptLookup

    return PromptLookup(method.k, max_ngram=method.ngram)


def _draft(method: Spec, draft: DraftModel | None) -> Proposer:
    from ..proposers import TreeDraft

    return TreeDraft(draft, width=method.width) if method.width else draft


def _hybrid(method: Spec, draft: DraftModel | None) -> Proposer:
    from ..proposers import Hybrid

    return Hybrid(draft, _lookup(method, None))


def _suffix(method: Spec, draft: DraftModel | None) -> Proposer:
    from ..proposers import SuffixProposer

    return SuffixProposer(method.k)


# suffix+draft: the memory may guess this many times the draft's k (its long, confident matches)
SUFFIX_REACH = 4


def _suffix_draft(method: Spec, draft: DraftModel | None) -> Proposer:
    from ..proposers import SuffixHybrid, SuffixProposer

    return SuffixHybrid(draft, SuffixProposer(SUFFIX_REACH * method.k))


_ROUND = ("conf", "pay", "dyn")  # a draft's adaptive-k policies
KINDS: dict[str, Kind] = {
    "ar": Kind(("cat",), "specdec", build=_plain),
    # auto's options override what it resolves to, where that method takes them (resolve_auto)
    "auto": Kind(("k", "ngram", "quant", "vocab", *_ROUND, "width", "memory"), "auto"),
    "draft": Kind(("k", "quant", "vocab", *_ROUND, "width", "cat"), "specdec", uses_draft=True, build=_draft),
    "lookup": Kind(("k", "ngram", "cat"), "specdec", build=_lookup),
    "hybrid": Kind(("k", "ngram", "quant", "vocab", *_ROUND, "cat"), "specdec", uses_draft=True, build=_hybrid),
    # a memory of earlier requests' prompts and outputs (proposers.suffix): the server's proposer
    # keeps it across requests; alone, or its confident guesses else the draft's
    "suffix": Kind(("k",), "specdec", build=_suffix),
    "suffix+draft": Kind(("k", "quant", "vocab", *_ROUND, "cat"), "specdec", uses_draft=True, build=_suffix_draft),
    "hf-ar": Kind((), "hf"),
    "hf-assisted": Kind(("k", "quant"), "hf", uses_draft=True),
    "hf-lookup": Kind(("k", "ngram"), "hf"),
    "llamacpp": Kind((), "llamacpp"),
    "llamacpp-lookup": Kind(("k", "ngram"), "llamacpp"),
    "endpoint": Kind(("name",), "endpoint"),
}
