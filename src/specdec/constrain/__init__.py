"""Structured output: what a generation's text must match (a JSON object, a JSON schema, a GBNF
or Lark grammar, a grammar that starts at a trigger such as a tool call's tag: grammars), the
model's vocabulary as the grammar library reads it (vocab), and the per-row logits rule that
masks every row to the tokens the grammar allows after that row's own prefix (rule), exact under
speculation: the draft proposes under the mask, the target verifies under it, and rejected
guesses roll the matcher back.

The grammar library is llguidance (MIT, no dependencies of its own): on the default target's
151,936 ids its mask takes 15-30 us a row to compute (median) and the rule ~0.1-0.2 ms to apply it,
a schema compiles in ~2 ms, and it rolls back any number of tokens; xgrammar's masks are as fast
but it pulls triton (~1 GB) and compiles a schema in ~15-25 ms (scripts/measure/grammar_libraries.py)."""

from .grammars import Grammar, Tag, choice, gbnf, json_object, json_schema, lark, regex, triggered
from .rule import GrammarRule, grammar_rule

__all__ = ["Grammar", "GrammarRule", "Tag", "choice", "gbnf", "grammar_rule", "json_object", "json_schema", "lark",
           "regex", "triggered"]
