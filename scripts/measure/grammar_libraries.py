"""The grammar library choice for structured output (issue 54): llguidance against xgrammar on the
default target's vocabulary (151,936 logits columns), and specdec.constrain's whole rule.

For a JSON object and an extraction schema: building the vocabulary, compiling the grammar, and
per row of a real JSON document (its tokens under the tokenizer) the mask's compute time and the
time to apply it to a float32 row, cold (first pass: lazily built lexer states) and warm (later
passes); then rolling back 7 tokens and re-consuming them. Both libraries' masks are applied the
same way (specdec.constrain.rule's: unpack the inverted bits, masked_fill), and xgrammar's own CPU
kernel is timed too. Then GrammarRule.apply per row, as the decode loop calls it.

xgrammar is not a dependency (it pulls triton, ~1 GB): `pip install xgrammar==0.2.8` first, or
it is left out. One thread, as a decode row sees the mask:

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/grammar_libraries.py
"""

from __future__ import annotations

import json
from importlib.metadata import version
import statistics
import time

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "email": {"type": "string"},
        "role": {"enum": ["engineer", "manager", "designer", "other"]},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                    "zip": {"type": ["string", "null"]}}, "required": ["city", "country", "zip"],
                    "additionalProperties": False},
        "remote": {"type": "boolean"}, "salary": {"type": "number"},
    },
    "required": ["name", "age", "email", "role", "skills", "address", "remote", "salary"],
    "additionalProperties": False,
}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "role": "engineer",
            "skills": ["mathematics", "poetry", "analytical engines"],
            "address": {"city": "London", "country": "United Kingdom", "zip": None}, "remote": False, "salary": 1234.5}
WIDTH, ENDS, PASSES = 151936, [151643, 151645], 5


def apply_bits(row: torch.Tensor, bits: torch.Tensor) -> None:
    banned = np.unpackbits(np.invert(bits.numpy().view(np.uint8)), count=row.numel(), bitorder="little")
    row.masked_fill_(torch.from_numpy(banned.view(bool)), float("-inf"))


def walk(name: str, ids: list[int], fill, accept, reset, rollback, apply=apply_bits, bits=None) -> None:
    row0 = torch.randn(WIDTH)
    cold, warm, applied = [], [], []
    for p in range(PASSES):
        reset()
        for t in ids:
            row = row0.clone()
            t0 = time.perf_counter()
            fill()
            t1 = time.perf_counter()
            apply(row, bits)
            t2 = time.perf_counter()
            (cold if p == 0 else warm).append(t1 - t0)
            applied.append(t2 - t1)
            assert torch.isfinite(row[t]), (name, t)
            assert accept(t) is not False, (name, t)
    reset()
    for t in ids:
        accept(t)
    t0 = time.perf_counter()
    rollback(7)
    back = time.perf_counter() - t0
    assert all(accept(t) is not False for t in ids[-7:])
    us = lambda xs, q=0.5: 1e6 * sorted(xs)[int(q * (len(xs) - 1))]  # noqa: E731
    print(f"  {name}: mask cold median {us(cold):.0f} us max {1e6 * max(cold):.0f}; warm median {us(warm):.0f} "
          f"p90 {us(warm, 0.9):.0f} max {1e6 * max(warm):.0f}; apply median {us(applied):.0f} us; "
          f"rollback(7) {1e6 * back:.0f} us, re-consumed")


def llguidance_(tokenizer, ids: list[int]) -> None:
    import llguidance
    import llguidance.hf

    t0 = time.perf_counter()
    vocab = llguidance.hf.from_tokenizer(tokenizer, n_vocab=WIDTH, eos_token=ENDS)
    print(f"llguidance {llguidance.__version__}: vocabulary {time.perf_counter() - t0:.2f} s")
    for label, schema in (("json_object", {"type": "object"}), ("schema", SCHEMA)):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(vocab, llguidance.LLMatcher.grammar_from_json_schema(schema))
        print(f"  {label}: compile {1e3 * (time.perf_counter() - t0):.1f} ms")
        bits = torch.empty((WIDTH + 31) // 32, dtype=torch.int32)
        walk(f"{label}", ids, lambda: m.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4), m.consume_token,
             m.reset, m.rollback, bits=bits)


def xgrammar_(tokenizer, ids: list[int]) -> None:
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar: not installed (pip install xgrammar==0.2.8), left out")
        return
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=WIDTH, stop_token_ids=ENDS)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    print(f"xgrammar {version('xgrammar')}: vocabulary {time.perf_counter() - t0:.2f} s")
    for label, compile_ in (("json_object", compiler.compile_builtin_json_grammar),
                            ("schema", lambda: compiler.compile_json_schema(json.dumps(SCHEMA)))):
        t0 = time.perf_counter()
        m = xgr.GrammarMatcher(compile_())
        print(f"  {label}: compile {1e3 * (time.perf_counter() - t0):.1f} ms")
        bits = xgr.allocate_token_bitmask(1, WIDTH)
        walk(label, ids, lambda: m.fill_next_token_bitmask(bits), m.accept_token, m.reset, m.rollback,
             apply=lambda row, b: apply_bits(row, b[0]), bits=bits)
        walk(f"{label} (xgrammar's own CPU apply)", ids, lambda: m.fill_next_token_bitmask(bits), m.accept_token,
             m.reset, m.rollback, apply=lambda row, b: xgr.apply_token_bitmask_inplace(row[None], b), bits=bits)


def rule_rows(tokenizer, ids: list[int]) -> None:
    from specdec.constrain import grammar_rule, json_schema

    prompt = tokenizer.encode("Extract the person as JSON.", add_special_tokens=False)
    seq = torch.tensor(prompt + ids)
    times = []
    for _ in range(PASSES):
        rule = grammar_rule(json_schema(SCHEMA), tokenizer, WIDTH, ENDS, len(prompt))
        for j in range(len(ids)):
            row = torch.randn(1, WIDTH)
            t0 = time.perf_counter()
            rule.apply(row, seq, len(prompt) + j)
            times.append(time.perf_counter() - t0)
    print(f"specdec.constrain GrammarRule.apply, one row after each of the document's tokens: median "
          f"{1e6 * statistics.median(times):.0f} us, max {1e6 * max(times):.0f} us ({len(times)} rows)")


def main() -> None:
    from specdec.gguf import tokenizer_of

    torch.set_num_threads(1)
    tokenizer = tokenizer_of("qwen2.5-coder-1.5b-instruct")
    ids = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"document: {len(ids)} tokens; {WIDTH} logits columns")
    llguidance_(tokenizer, ids)
    xgrammar_(tokenizer, ids)
    rule_rows(tokenizer, ids)


if __name__ == "__main__":
    main()
