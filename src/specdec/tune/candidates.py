"""What `specdec advise` ranks: every method family specdec can run on this target and device,
and the ones it leaves out, each with why.

A family is a method without its round options (k, conf, pay, dyn, width): its acceptance is
measured once on the calibration prompts and the cost model prices every k of it. The draft runs
in each weight form the device has kernels for (none everywhere; int8 and int4 on a CPU) and, on
a large vocabulary, with its head restricted to the HEAD most frequent ids (in the cheapest form
only, int4 on a CPU: a restricted head trims the output layer, the share of a step that grows
with the vocabulary); prompt lookup; and the hybrid, lookup where an n-gram matches, else the
draft variant ranked first (hybrid_of), measured after the drafts.
"""

from __future__ import annotations

from ..methods.spec import DEFAULT_NGRAM, Method

HEAD = 32768  # a restricted head's size (the ids that cover most text of a 150k vocabulary)

# Families and options advise does not rank, and why (recorded in the advice).
NOT_RANKED = {
    "draft:width=2": "tree rounds verify a tree of width*k nodes whose accepted depth the chain cost model does "
                     "not price; compare them with `specdec bench --methods draft:k=3:width=2,...`",
    "conf": "a confidence floor stops rounds at a data-dependent length the fixed-k model does not price",
    "pay": "pay=1 is the cost model's own per-round rule over these same terms: run it with --pay-rule FILE",
    "dyn": "dyn=1 adapts k from the acceptance seen so far; the fixed-k model does not price the schedule",
}


def candidates(has_draft: bool, device: str, quant: str | None = None, vocab: int | None = None,
               vocab_size: int | None = None, quick: bool = False) -> list[Method]:
    """The families advise measures before the hybrid. A --draft-quant or --draft-vocab given
    fixes that option; `vocab_size` (the target's, None without a tokenizer) decides whether a
    restricted head applies; `quick` keeps the given form and the cheapest one only."""
    drafts = []
    if has_draft:
        forms = [quant] if quant else _forms(device, quick)
        drafts = [Method("draft", quant=q, vocab=vocab) for q in forms]
        if vocab is None and not quick and vocab_size is not None and vocab_size > HEAD:
            drafts.append(Method("draft", quant=forms[-1], vocab=HEAD))
    return [*drafts, Method("lookup", ngram=DEFAULT_NGRAM)]


def _forms(device: str, quick: bool) -> list[str | None]:
    """The draft's weight forms, the cheapest last: int8 and int4 run on specdec's CPU kernels."""
    if not str(device).startswith("cpu"):
        return [None]
    return [None, "int4"] if quick else [None, "int8", "int4"]


def hybrid_of(draft: Method) -> Method:
    """The hybrid over a draft variant: lookup where an n-gram matches, that draft otherwise."""
    return Method("hybrid", ngram=DEFAULT_NGRAM, quant=draft.quant, vocab=draft.vocab)


def draft_variant(family: Method) -> Method:
    """The draft form a family runs, the key its C_D is measured and recorded under."""
    return Method("draft", quant=family.quant, vocab=family.vocab)
