"""What `specdec advise` ranks: every method family specdec can run on this target and device,
and the ones it leaves out, each with why.

A family is a method without its round options (k, conf, pay, dyn, width): its acceptance is
measured once on the calibration prompts and the cost model prices every k of it. The draft runs
in each weight form the device has kernels for (none everywhere; int8 and int4 on a CPU; int3
where the draft runs on the native runtime) and, on a large vocabulary, with its head restricted
to the HEAD most frequent ids (in the cheapest form, and int4 beside int3: a restricted head trims
the output layer, the share of a step that grows with the vocabulary; int3 trades acceptance for
bytes, so both are ranked); prompt lookup; and the hybrid, lookup where an n-gram matches, else the
draft variant ranked first (hybrid_of), measured after the drafts.

Then the round options (round_variants): the best-predicted family of each kind that takes them
(draft and hybrid), at its best k, as a tree of width 2 and 3 (the draft only), with a
confidence floor, with the acceptance schedule (dyn=1) and with the pay rule, each calibrated in
a run of its own and priced from what its rounds did.
"""

from __future__ import annotations

from dataclasses import replace

from ..methods.spec import DEFAULT_NGRAM, Method

HEAD = 32768  # a restricted head's size (the ids that cover most text of a 150k vocabulary)

WIDTHS = (2, 3)  # the tree widths ranked; a width-w tree at k verifies up to w*k nodes in one block
# The confidence floor ranked: the one docs/quant.md measured (hybrid and draft at k=4 on Spec-Bench).
CONF = 0.6

# Options advise does not rank, and why (recorded in the advice).
NOT_RANKED = {
    "round options of the other families": "only the best-predicted family of each kind that takes them (draft, "
                                           "hybrid) is calibrated with them, at its best k: each variant is a "
                                           "calibration run of its own",
    "other conf floors, width above 3, conf/dyn/pay combined": "not calibrated; compare them with `specdec bench "
                                                               "--methods ...`",
}
QUICK = {"width, conf, dyn, pay": "--quick calibrates no round options: the families are ranked at fixed k only"}


def candidates(has_draft: bool, device: str, quant: str | None = None, vocab: int | None = None,
               vocab_size: int | None = None, quick: bool = False, native: bool = False) -> list[Method]:
    """The families advise measures before the hybrid. A --draft-quant or --draft-vocab given
    fixes that option; `vocab_size` (the target's, None without a tokenizer) decides whether a
    restricted head applies; `quick` keeps the given form and the int4 one only; `native`: the
    draft runs on the native runtime (int3 then applies)."""
    drafts = []
    if has_draft:
        forms = [quant] if quant else _forms(device, quick, native)
        drafts = [Method("draft", quant=q, vocab=vocab) for q in forms]
        if vocab is None and not quick and vocab_size is not None and vocab_size > HEAD:
            drafts += [Method("draft", quant=q, vocab=HEAD) for q in forms[-2 if forms[-1] == "int3" else -1:]]
    return [*drafts, Method("lookup", ngram=DEFAULT_NGRAM)]


def _forms(device: str, quick: bool, native: bool) -> list[str | None]:
    """The draft's weight forms, the cheapest last: int8 and int4 run on specdec's CPU kernels,
    int3 on the native runtime."""
    if not str(device).startswith("cpu"):
        return [None]
    if quick:
        return [None, "int4"]
    return [None, "int8", "int4", "int3"] if native else [None, "int8", "int4"]


def hybrid_of(draft: Method) -> Method:
    """The hybrid over a draft variant: lookup where an n-gram matches, that draft otherwise."""
    return Method("hybrid", ngram=DEFAULT_NGRAM, quant=draft.quant, vocab=draft.vocab)


def draft_variant(family: Method) -> Method:
    """The draft form a family runs, the key its C_D is measured and recorded under."""
    return Method("draft", quant=family.quant, vocab=family.vocab)


def round_variants(best: Method) -> list[Method]:
    """The round options that apply to a family at its best k (a full spec with k): tree widths
    for the draft alone (specdec's hybrid takes no width), then conf, dyn and pay. At k=1 a
    round guesses one token whatever a stop or schedule says, so only the trees remain."""
    trees = [replace(best, width=w) for w in WIDTHS] if best.kind == "draft" else []
    if best.k == 1:
        return trees
    return [*trees, replace(best, conf=CONF), replace(best, dyn=True), replace(best, pay=True)]
