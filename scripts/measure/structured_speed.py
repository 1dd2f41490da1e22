"""Speculation under a JSON schema against speculation without one (issue 54's goal: under a
schema, speculation keeps >= 90% of its unconstrained speedup over plain decoding).

Loads the pair once as `specdec generate` does (specdec.load: `--proposer auto` resolved, the
registry's default pair on the native runtime) and decodes each extraction prompt (a paragraph,
"extract the fields as JSON", through the chat template) in four cells: plain and speculative,
each free and under SCHEMA (specdec.constrain's rule on every row). The cells' order rotates from
prompt to prompt; one warm-up pass over all cells on the first prompt is discarded. Per run:
decode tok/s as `specdec generate` prints it, tokens, acceptance, and whether a constrained
output validates. Wrap in `flock /tmp/cpu.lock` on a shared machine.

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/structured_speed.py --out /tmp/structured

Prints and writes OUT/report.md and OUT/runs.jsonl: per cell the median tok/s, and per prompt the
speedup over plain decoding free and under the schema, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

from specdec.cli.args import spec_of
from specdec.cli.flags import add_model_args

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": ["integer", "null"]}, "city": {"type": "string"},
        "occupation": {"type": "string"}, "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
        "employer": {"type": ["string", "null"]}, "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "occupation", "skills", "employer", "remote"],
    "additionalProperties": False,
}
PARAGRAPHS = [
    "Maria Gonzalez, 34, is a data engineer at Northwind Analytics in Madrid. She builds streaming pipelines in "
    "Scala and Python, knows Kafka and Spark well, and works from home three days a week.",
    "Kenji Watanabe is a 51-year-old structural engineer in Osaka. He designs earthquake-resistant bridges for "
    "Kansai Steel, uses finite element software daily and goes to the office every day.",
    "At 27, Aisha Bello already leads the mobile team at a fintech start-up called Paystack in Lagos. She writes "
    "Kotlin and Swift, reviews security audits, and works fully remotely.",
    "Tom Becker (42) repairs vintage synthesizers in his own workshop in Hamburg. He solders, programs "
    "microcontrollers in C and restores wooden cases; he has no employer and never works remotely.",
    "Priya Raman, a 39-year-old epidemiologist based in Toronto, models disease spread for the Public Health "
    "Agency of Canada using R and Stan, and teaches a statistics course online.",
    "Lucas Moreau is a freelance translator from Lyon, aged 30, who translates technical manuals from German "
    "and English into French with CAT tools, working entirely from home.",
    "Grace Kim, 45, is the head chef of Gangnam Table in Seoul. She plans menus, ferments kimchi, manages a "
    "team of twelve cooks and is in the kitchen every evening.",
]


def prompt_text(paragraph: str) -> str:
    return (f"Extract the person's name, age, city, occupation, skills, employer and whether they work "
            f"remotely from this text, as a JSON object.\n\n{paragraph}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--method", default="auto", help="the speculative --proposer spec (default auto)")
    ap.add_argument("--out", type=Path, required=True)
    add_model_args(ap)
    opts = ap.parse_args()

    import jsonschema
    import torch

    from specdec.constrain import grammar_rule, json_schema
    from specdec.decode.engine import generate
    from specdec.load import load
    from specdec.methods.spec import parse
    from specdec.prompts.chat import encode_prompt

    loaded = load(spec_of(opts, parse(opts.method)))
    lm, tokenizer, grammar = loaded.lm(), loaded.tokenizer, json_schema(SCHEMA)
    drafters = {"plain": None, "speculative": loaded.proposer}
    cells = [(m, c) for m in drafters for c in ("free", "schema")]

    def run(ids: list[int], method: str, constraint: str) -> dict:
        rules = (grammar_rule(grammar, tokenizer, lm.vocab_size, lm.eos_token_ids, len(ids)),) \
            if constraint == "schema" else ()
        result = generate(lm, ids, drafter=drafters[method], max_new_tokens=opts.max_new_tokens, rules=rules)
        text, st = tokenizer.decode(result.new_tokens, skip_special_tokens=True), result.stats
        valid = None
        if constraint == "schema":
            try:
                jsonschema.validate(json.loads(text), SCHEMA)
                valid = True
            except (ValueError, jsonschema.ValidationError):
                valid = False
        return {"method": method, "constraint": constraint, "tok_s": st.tokens_per_s, "tokens": st.new_tokens,
                "proposed": st.proposed, "accepted": st.accepted, "finish": result.finish_reason, "valid": valid,
                "text": text}

    prompts = [encode_prompt(tokenizer, prompt_text(p)) for p in PARAGRAPHS]
    for cell in cells:  # warm-up, discarded
        run(prompts[0], *cell)
    rows = []
    opts.out.mkdir(parents=True, exist_ok=True)
    with open(opts.out / "runs.jsonl", "w") as f:
        for i, ids in enumerate(prompts[1:]):
            shift = i % len(cells)
            for cell in cells[shift:] + cells[:shift]:
                row = {"prompt": i + 1, **run(ids, *cell)}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                print(f"prompt {i + 1} {cell[0]:12s} {cell[1]:7s} {row['tok_s']:6.2f} tok/s {row['tokens']:4d} tok "
                      f"{row['finish']:7s} valid={row['valid']}", file=sys.stderr, flush=True)
    text = report(rows, loaded.method.label, torch)
    (opts.out / "report.md").write_text(text)
    print(text)
    return 0


def report(rows: list[dict], label: str, torch) -> str:
    at = {(r["prompt"], r["method"], r["constraint"]): r for r in rows}
    prompts = sorted({r["prompt"] for r in rows})
    speedup = {c: [at[(p, "speculative", c)]["tok_s"] / at[(p, "plain", c)]["tok_s"] for p in prompts]
               for c in ("free", "schema")}
    kept = [s / f for s, f in zip(speedup["schema"], speedup["free"])]
    lines = ["# Speculation under a JSON schema", "", f"`{' '.join(sys.argv)}`", "",
             f"CPU: {platform.processor() or platform.machine()} ({_cpu()}), torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; speculative method: {label}", "",
             "| cell | median tok/s | median tokens | acceptance | valid |", "|---|---|---|---|---|"]
    for method in ("plain", "speculative"):
        for c in ("free", "schema"):
            mine = [at[(p, method, c)] for p in prompts]
            proposed = sum(r["proposed"] for r in mine)
            acc = f"{100 * sum(r['accepted'] for r in mine) / proposed:.0f}%" if proposed else ""
            valid = f"{sum(bool(r['valid']) for r in mine)}/{len(mine)}" if c == "schema" else ""
            lines.append(f"| {method} {c} | {statistics.median(r['tok_s'] for r in mine):.2f} | "
                         f"{statistics.median(r['tokens'] for r in mine):.0f} | {acc} | {valid} |")
    lines += ["", f"Speedup over plain, median of per-prompt ratios: free {statistics.median(speedup['free']):.2f}x, "
              f"under the schema {statistics.median(speedup['schema']):.2f}x; schema speedup / free speedup per "
              f"prompt: median {statistics.median(kept):.2f}, min {min(kept):.2f}."]
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
