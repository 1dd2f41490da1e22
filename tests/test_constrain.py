"""Structured output under speculation (specdec.constrain): grammars checked when made; the
grammar rule's rows for any query (committed tokens + guesses, rejected guesses rolled back, in
any order) equal a fresh matcher's (hypothesis over random accept lengths and corrupted guesses);
greedy constrained speculation equals constrained plain decoding for every proposer, bit for bit,
and every output validates against its schema; sampled constrained output keeps the constrained
target's distribution (chi-square). Models: the tiny GGUF pair of tests/serve_native.py (random
weights, SmolLM2's byte-level BPE cut to 2048 tokens) on the native runtime."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_native import tiny_models

from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft, generate
from specdec.constrain import Tag, gbnf, grammar_rule, json_object, json_schema, lark, triggered
from specdec.decode.batch import Batch
from specdec.decode.sequence import Options
from specdec.errors import SpecdecError
from specdec.proposers import SuffixHybrid, SuffixProposer

# Bounded, so that even random weights close the object well within the token limit.
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["colour", "ok", "count", "tags"],
    "additionalProperties": False,
}
DOCUMENT = {"colour": "green", "ok": True, "count": 42, "tags": ["ab", "xyz"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, draft, tokenizer) of the tiny GGUF pair on the native runtime."""
    return tiny_models(tmp_path_factory.mktemp("constrain-gguf"))


def rule_for(grammar, lm, tokenizer, prompt_length: int):
    return grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, prompt_length)


# --- grammars are checked when made ------------------------------------------------------------


@pytest.mark.parametrize("make,message", [
    (lambda: json_schema({"type": "objekt"}), "the JSON schema is not usable: Invalid type: objekt"),
    (lambda: json_schema(["not", "a", "schema"]), "must be a JSON object"),
    (lambda: json_schema({"type": "string", "pattern": "(["}), "the JSON schema is not usable: regex parse error"),
    (lambda: gbnf('root ::= "a" | b'), "Rule 'b' not found"),
    (lambda: gbnf("  "), "must be a non-empty string"),
    (lambda: lark("start: missing"), 'unknown name: "missing"'),
    (lambda: triggered([]), "needs at least one tag"),
    (lambda: triggered([Tag("<call>", "<other>", {}, "")]), "must start with its trigger"),
])
def test_a_bad_schema_or_grammar_is_an_error_naming_the_problem(make, message):
    with pytest.raises(SpecdecError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make()


def test_the_mask_allows_what_the_grammar_allows_and_only_end_ids_once_complete(tiny):
    target, _, tokenizer = tiny
    prompt = [5, 6, 7]
    text = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    rule = rule_for(json_schema(SCHEMA), target, tokenizer, len(prompt))
    seq = torch.tensor(prompt + text)
    rows = rule.apply(torch.zeros(len(text) + 1, target.vocab_size), seq, len(prompt))
    for j, token in enumerate(text):  # the document's own tokens are allowed at each step
        assert rows[j, token] == 0, (j, tokenizer.decode(text[: j + 1]))
    assert torch.isinf(rows[0, tokenizer.encode("[", add_special_tokens=False)[0]])  # not an object's start
    assert rows[-1].isfinite().nonzero().flatten().tolist() == sorted(target.eos_token_ids)
    wide = rule.apply(torch.zeros(1, target.vocab_size + 7), seq, seq.numel())  # columns past the vocabulary
    assert torch.isinf(wide[0, target.vocab_size :]).all()


def test_a_row_after_a_forbidden_token_is_left_as_it_is(tiny):
    target, _, tokenizer = tiny
    rule = rule_for(json_object(), target, tokenizer, 1)
    bad = tokenizer.encode("x", add_special_tokens=False)
    rows = torch.randn(2, target.vocab_size)
    got = rule.apply(rows.clone(), torch.tensor([9, *bad]), 1)
    assert torch.isinf(got[0, bad[0]]) and torch.equal(got[1], rows[1])


# --- the matcher follows any query: rollback under rejected guesses ----------------------------


def fresh_row(grammar, lm, tokenizer, prompt_length: int, row: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    return rule_for(grammar, lm, tokenizer, prompt_length).apply(row[None].clone(), prefix, prefix.numel())[0]


rounds = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6), st.booleans(), st.integers(0, 2047)),
                  min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(rounds, st.integers(0, 2**31 - 1))
def test_every_row_equals_a_fresh_matchers_whatever_was_guessed_and_rejected(tiny, plan, seed):
    """Rounds over the document: k guesses (the document's next tokens, one maybe replaced by
    a random token), the draft's one-row steps over them, the target's block, then an accept
    length; each row the rule returns equals a fresh matcher's row for that row's prefix."""
    target, _, tokenizer = tiny
    grammar = json_schema(SCHEMA)
    text = torch.tensor(tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False))
    prompt = torch.tensor([3, 4, 5, 6])
    rule = rule_for(grammar, target, tokenizer, prompt.numel())
    gen = torch.Generator().manual_seed(seed)
    committed = 0
    for k, accept, corrupt, noise in plan:
        seq = torch.cat([prompt, text[:committed]])
        guesses = text[committed : committed + k].clone()
        if corrupt and guesses.numel():
            guesses[noise % guesses.numel()] = noise
        rows = torch.randn(guesses.numel() + 1, target.vocab_size, generator=gen)
        for i in range(guesses.numel()):  # the draft's steps: one row each after i guesses
            query = torch.cat([seq, guesses[:i]])
            got = rule.apply(rows[i : i + 1].clone(), query, query.numel())[0]
            assert torch.equal(got, fresh_row(grammar, target, tokenizer, prompt.numel(), rows[i], query))
        block = rule.apply(rows.clone(), torch.cat([seq, guesses]), seq.numel())
        for i in range(rows.shape[0]):
            query = torch.cat([seq, guesses[:i]])
            assert torch.equal(block[i], fresh_row(grammar, target, tokenizer, prompt.numel(), rows[i], query))
        committed = min(text.numel(), committed + min(accept, guesses.numel()) + 1)


# --- greedy: speculation under the grammar equals plain decoding under it ----------------------


METHODS = ["draft", "lookup", "hybrid", "tree", "suffix", "suffix+draft"]


def proposers(draft) -> dict:
    return {"draft": DraftModel(draft, 3), "lookup": PromptLookup(3), "hybrid": Hybrid(DraftModel(draft, 3),
            PromptLookup(3)), "tree": TreeDraft(DraftModel(draft, 3), 2), "suffix": SuffixProposer(4),
            "suffix+draft": SuffixHybrid(DraftModel(draft, 3), SuffixProposer(4))}


def prompt_of(tokenizer) -> list[int]:
    return tokenizer.encode('Reply in JSON. {"colour": "green", "ok": true, "count": 4, "tags": ["a"]} and '
                            '{"colour": "red", "ok": false', add_special_tokens=False)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("which", ["schema", "object", "gbnf"])
def test_greedy_speculation_under_a_grammar_equals_plain_decoding_under_it(tiny, method, which):
    target, draft, tokenizer = tiny
    grammar = {"schema": json_schema(SCHEMA), "object": json_object(),
               "gbnf": gbnf('root ::= "{\\"answer\\": " ("yes" | "no" | [0-9]{1,3}) "}"')}[which]
    prompt = prompt_of(tokenizer)
    rules = lambda: (rule_for(grammar, target, tokenizer, len(prompt)),)  # noqa: E731 - one per generation
    plain = generate(target, prompt, max_new_tokens=120, rules=rules())
    assert plain.new_tokens != generate(target, prompt, max_new_tokens=120).new_tokens  # the grammar matters
    out = generate(target, prompt, drafter=proposers(draft)[method], max_new_tokens=120, rules=rules(), check=True)
    assert out.new_tokens == plain.new_tokens
    if which != "object":  # bounded grammars end within the limit, on an end id
        assert out.finish_reason == "eos"
        text = tokenizer.decode(out.new_tokens, skip_special_tokens=True)
        if which == "schema":
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert re.fullmatch(r'\{"answer": (yes|no|[0-9]{1,3})\}', text), text
    if method in ("draft", "hybrid", "tree", "suffix+draft"):
        assert out.stats.proposed > 0


def test_a_batch_decodes_each_sequence_under_its_own_grammar(tiny):
    target, draft, tokenizer = tiny
    prompt = prompt_of(tokenizer)
    grammars = [json_schema(SCHEMA), None, gbnf('root ::= ("yes" | "no") "."')]

    def rules(g):
        return () if g is None else (rule_for(g, target, tokenizer, len(prompt)),)

    alone = [generate(target, prompt, drafter=DraftModel(draft, 3), max_new_tokens=120, rules=rules(g)).new_tokens
             for g in grammars]
    batch = Batch(target, DraftModel(draft, 3))
    started = [batch.add(torch.tensor(prompt), Options(120, rules=rules(g))) for g in grammars]
    while batch.running:
        assert all(error is None for _, error in batch.step())
    assert [d.result().new_tokens for d in started] == alone
    jsonschema.validate(json.loads(tokenizer.decode(alone[0], skip_special_tokens=True)), SCHEMA)
    assert tokenizer.decode(alone[2], skip_special_tokens=True) in ("yes.", "no.")
