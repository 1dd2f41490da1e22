"""Does an all-Q4 draft pay? The 0.5B int4 draft on the native runtime keeps its Q6_K layers as
exact Q8 and its head in Q8; a draft need not be exact (only the target decides the tokens), so
round those to Q4 (groups of 32) and measure, paired with today's form: the draft's step against
the target's, its weight bytes, and draft:k=3 acceptance and tok/s on HumanEval and Spec-Bench
prompts (outputs checked equal to plain decoding). Run under the CPU lock:

    flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/lean_draft.py [--prompts 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch
from runtime_bench import DRAFT, TARGET, cpu, paired_steps
from transformers import AutoConfig

from specdec import DraftModel, generate
from specdec.models.draft_head import frequent_head_ids
from specdec.models.load import load_tokenizer
from specdec.models.registry import REGISTRY, converted_folder
from specdec.prompts.chat import encode_prompt
from specdec.prompts.datasets import dataset_path, read_prompts
from specdec.quant.weights import Q8Weight, q4_rtn
from specdec.runtime import load_registry
from specdec.runtime.config import decoder_config
from specdec.runtime.lm import NativeLM
from specdec.runtime.load import _assemble, _registry_source


def lean_draft(head_ids: torch.Tensor) -> NativeLM:
    """The int4 draft with every Q8 layer (exact Q6_K, the Q8_0 head) rounded to Q4."""
    config = AutoConfig.from_pretrained(converted_folder(REGISTRY[DRAFT]))
    cfg = decoder_config(config)
    source = _registry_source(DRAFT, cfg, "int4")
    linears = {n: q4_rtn(w.dequantize(), 32) if isinstance(w, Q8Weight) else w for n, w in source.linears.items()}
    return _assemble(config, dataclasses.replace(source, linears=linears), "int4", 4096, head_ids, ())


def run(target, drafts: dict, prompts: list[torch.Tensor], new: int) -> dict:
    """Per prompt: plain and draft:k=3 with each draft form, interleaved, second pass kept."""
    rows = []
    for prompt in prompts:
        for _ in range(2):
            plain = generate(target, prompt, max_new_tokens=new)
            row = {"ar": plain.stats.tokens_per_s}
            for name, draft in drafts.items():
                out = generate(target, prompt, drafter=DraftModel(draft, k=3), max_new_tokens=new)
                row[name] = {"tok_s": out.stats.tokens_per_s, "equal": out.new_tokens == plain.new_tokens,
                             "accepted_per_round": out.stats.accepted / max(out.stats.rounds, 1)}
        rows.append(row)
    summary = {name: {"median_tok_s": statistics.median(r[name]["tok_s"] for r in rows),
                      "median_accepted_per_round": statistics.median(r[name]["accepted_per_round"] for r in rows),
                      "equal": sum(r[name]["equal"] for r in rows)} for name in drafts}
    ratio = [r["lean"]["tok_s"] / r["today"]["tok_s"] for r in rows]
    return {"rows": rows, "summary": summary, "median_lean_over_today": statistics.median(ratio)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--out", default="/tmp/lean_draft.json")
    args = parser.parse_args()
    tokenizer = load_tokenizer(TARGET)
    target = load_registry(TARGET, "int4")
    head = frequent_head_ids(tokenizer, 32768, len(tokenizer))
    drafts = {"today": load_registry(DRAFT, "int4", head_ids=head), "lean": lean_draft(head)}
    sets = {d: [torch.tensor(encode_prompt(tokenizer, p.text)) for p in read_prompts(dataset_path(d))[::7][:args.prompts]]
            for d in ("humaneval", "spec-bench")}
    report = {"cpu": cpu(), "weight_bytes": {n: d.weight_bytes() for n, d in drafts.items()},
              "target_bytes": target.weight_bytes()}
    ms = paired_steps({"target": target, **drafts}, sets["humaneval"][0])
    report["step_ms"] = ms
    report["fraction"] = {n: ms[n] / ms["target"] for n in drafts}
    print(json.dumps(report, indent=1), flush=True)
    report.update({d: run(target, drafts, prompts, args.new) for d, prompts in sets.items()})
    print(json.dumps({d: report[d]["summary"] | {"lean/today": report[d]["median_lean_over_today"]}
                      for d in sets}, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
