"""Method specs (specdec.methods.spec): one grammar, checked once; and the one builder (specdec.methods.build)."""

import pytest
import torch
from conftest import tiny_model

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft
from specdec.errors import SpecdecError
from specdec.methods.build import Drafts, build_proposer
from specdec.methods.kinds import KINDS, RUNNERS
from specdec.methods.spec import DEFAULT_K, Method, legacy, parse, parse_list, resolve_auto


def test_method_parsing():
    methods = parse_list("ar, draft:k=4,draft:quant=int8,lookup,lookup:k=8:ngram=2,hf-ar,hf-assisted:k=6,hf-lookup,"
                         "hybrid:k=3,draft:k=4:conf=0.6,draft:vocab=100:k=3:quant=int8,draft:width=2:k=3,ar:cat=1,"
                         "lookup:cat=1:k=2")
    assert [m.label for m in methods] == [
        "ar",
        "draft:k=4",
        f"draft:k={DEFAULT_K}:quant=int8",
        f"lookup:k={DEFAULT_K}:ngram=3",
        "lookup:k=8:ngram=2",
        "hf-ar",
        "hf-assisted:k=6",
        f"hf-lookup:k={DEFAULT_K}:ngram=3",
        "hybrid:k=3:ngram=3",
        "draft:k=4:conf=0.6",
        "draft:k=3:quant=int8:vocab=100",  # canonical option order
        "draft:k=3:width=2",
        "ar:cat=1",
        "lookup:k=2:ngram=3:cat=1",
    ]
    assert methods[2] == Method("draft", k=DEFAULT_K, quant="int8")
    assert parse_list("auto") == [Method("auto")]
    # the shorthand flags fold into every method that takes them
    folded = parse_list("ar,draft:k=2,hybrid,lookup,hf-assisted", {"quant": ("--draft-int8", "int8"),
                                                                  "ngram": ("--max-ngram", "2")})
    assert [m.label for m in folded] == ["ar", "draft:k=2:quant=int8", "hybrid:k=2:ngram=2:quant=int8",
                                         "lookup:k=2:ngram=2", "hf-assisted:k=2:quant=int8"]


@pytest.mark.parametrize("text, message", [
    ("ar,medusa", "unknown method 'medusa'"),
    ("draft:k=0", "k in 'draft:k=0' must be >= 1"),
    ("draft:k=two", "must be a whole number"),
    ("draft:ngram=2", "bad option 'ngram=2' in 'draft:ngram=2'; draft takes k="),
    ("ar:k=2", "bad option 'k=2' in 'ar:k=2'; ar takes cat="),
    ("hf-ar:cat=1", "hf-ar takes no options"),
    ("draft:k=3:conf=1", "must lie strictly between 0 and 1"),
    ("draft:k=3:conf=70", "must lie strictly between 0 and 1"),
    ("lookup:vocab=100", "lookup takes k=, ngram=, cat="),
    ("lookup:k=3,lookup:k=3:ngram=3", "lists lookup:k=3:ngram=3 twice"),
    ("draft-int8:k=2", "the int8 draft is written draft:quant=int8 now"),
    ("draft:quant=int2", "quant in 'draft:quant=int2' takes none, int8, int4, int3"),
    ("draft:k=2:pay=1:width=2", "pay=1 does not apply to a tree"),
    ("hybrid:k=2:width=2", "bad option 'width=2' in 'hybrid:k=2:width=2'"),
    ("draft:k=2:k=3", "k is given twice"),
    ("ar,,lookup", "has an empty entry"),
])
def test_bad_methods(text, message):
    with pytest.raises(SpecdecError, match=message):
        parse_list(text)


def test_flags_that_no_method_takes_or_that_contradict_a_spec_are_refused():
    with pytest.raises(SpecdecError, match="--draft-int8 applies to no method in --methods 'ar,lookup'"):
        parse_list("ar,lookup", {"quant": ("--draft-int8", "int8")})
    with pytest.raises(SpecdecError, match="--draft-vocab contradicts vocab=100 in draft:vocab=100"):
        parse_list("draft:vocab=100", {"vocab": ("--draft-vocab", "200")})


def test_auto_takes_its_options_where_the_choice_does():
    auto = parse("auto", {"k": ("-k", "4"), "quant": ("--draft-int8", "int8")})
    assert resolve_auto(auto, parse("draft:k=2")) == (parse("draft:k=4:quant=int8"), [])
    assert resolve_auto(auto, parse("lookup:k=3")) == (parse("lookup:k=4"), ["quant=int8"])
    assert resolve_auto(auto, parse("ar")) == (parse("ar"), ["k=4", "quant=int8"])
    with pytest.raises(SpecdecError, match="pay=1 does not apply to a tree"):
        resolve_auto(parse("auto:pay=1"), parse("draft:k=2:width=2"))


def test_configs_before_the_grammar_read_as_methods():
    assert legacy({"label": "draft-int8:k=4:conf=70", "kind": "draft-int8", "k": 4, "conf": 70}) == \
        parse("draft:k=4:quant=int8:conf=0.7")
    assert legacy({"label": "lookup:k=2:ngram=3:cat=1", "kind": "lookup", "k": 2, "ngram": 3, "cat": 1}) == \
        parse("lookup:k=2:ngram=3:cat=1")


def test_each_spec_builds_its_proposer():
    drafts = Drafts(tiny_model(1))
    methods = [parse(t) for t in ("ar", "lookup:k=3:ngram=2", "draft:k=3:conf=0.5", "draft:width=2", "hybrid:k=2")]
    drafts.prepare(methods)
    none, lookup, draft, tree, hybrid = (build_proposer(m, drafts) for m in methods)
    assert none is None
    assert isinstance(lookup, PromptLookup) and (lookup.k, lookup.max_ngram) == (3, 2)
    assert isinstance(draft, DraftModel) and (draft.k, draft.policy.floor) == (3, 0.5)
    assert not draft.lm.invariant  # a draft always runs as a proposer: logits in its dtype
    assert isinstance(tree, TreeDraft) and tree.width == 2 and isinstance(hybrid, Hybrid)
    for method in ("hf-assisted:k=2", "auto"):
        with pytest.raises(SpecdecError, match="has no specdec proposer"):
            build_proposer(parse(method), drafts)
    with pytest.raises(SpecdecError, match="need a draft model: pass --draft"):
        Drafts(None).prepare([parse("draft")])


def test_draft_variants_are_built_once_before_any_run():
    loaded = tiny_model(1)
    drafts = Drafts(loaded)
    drafts.prepare([parse("draft:quant=int8"), parse("hf-assisted:k=2"), parse("draft:k=3:quant=int8")])
    assert drafts.model((None, None)) is loaded  # hf-assisted runs the draft as loaded
    int8 = drafts.model(("int8", None))
    assert int8 is not loaded and not isinstance(int8.lm_head, torch.nn.Linear)
    # a single variant takes the loaded model itself (no copy of its weights) ...
    alone = tiny_model(1)
    only = Drafts(alone)
    only.prepare([parse("draft:quant=int8")])
    assert only.model(("int8", None)) is alone
    # ... so nothing is left to make another one from
    with pytest.raises(SpecdecError, match="made into draft:quant=int8 already"):
        only.model((None, None))
    # the loaded model handed out as it is is never changed in place afterwards
    plain = tiny_model(1)
    first = Drafts(plain)
    first.prepare([parse("draft")])
    assert first.model(("int8", None)) is not plain and isinstance(plain.lm_head, torch.nn.Linear)


def test_every_kind_is_in_the_one_table_and_runs_where_it_says():
    """Each kind's options, runner and builder come from methods.kinds: specdec's kinds build a
    proposer that declares the engine's contract (draft runtime, may_lag, observe)."""
    drafts = Drafts(tiny_model(1))
    for name, kind in KINDS.items():
        assert kind.runner in RUNNERS and (kind.build is not None) == (kind.runner == "specdec"), name
    specs = [parse(t) for t in ("lookup:k=3", "draft:k=3", "draft:k=3:width=2", "hybrid:k=2", "draft:k=3:dyn=1")]
    drafts.prepare(specs)
    for method in specs:
        proposer = build_proposer(method, drafts)
        assert (proposer.draft_lm is not None) == method.uses_draft and isinstance(proposer.may_lag, bool)
        assert proposer.may_lag == (method.kind == "hybrid")
        proposer.observe(0, 0)
    assert parse("draft:k=3:dyn=1").label == "draft:k=3:dyn=1" and parse("hf-ar").runner == "hf"
    with pytest.raises(SpecdecError, match="bad option 'dyn=1'"):
        parse("lookup:dyn=1")
