#!/usr/bin/env python
"""How often the draft's greedy guess is the target's greedy token, teacher-forced along the
target's own output from a bench run (its `ar` rows), for draft variants: float32 or int8 weights,
and the block size of the draft's prefill (int8 dynamic quantization takes one activation scale
per forward, so a long prefill block shares one scale across all its rows). A cheap proxy for
greedy acceptance that needs no target forward; decode steps are one row each, as in a round.

    .venv/bin/python scripts/draft_agreement.py docs/bench/humaneval-20-128 --prompts 10 \
        --variants int8@1024,int8@16,float32@1024

With --context N the prompt is instead sweep's N-token article prompt (specdec.prompts.long) and
the target's greedy tokens are generated here (--tokens of them).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

import specdec.decode.lm
from specdec.decode.engine import generate
from specdec.decode.lm import CausalLM
from specdec.models.draft_quant import int8_draft
from specdec.models.load import load_model
from specdec.prompts.chat import encode_prompt
from specdec.prompts.datasets import Selection, load_prompts
from specdec.prompts.long import long_prompt


@torch.inference_mode()
def agreement(model, prompt: torch.Tensor, wanted: list[int], chunk: int) -> float:
    """Share of `wanted` tokens the model's argmax predicts, each from the true prefix."""
    specdec.decode.lm.PREFILL_CHUNK = chunk
    lm = CausalLM(model)
    logits = lm.prefill(prompt)
    hits = 0
    for token in wanted:
        hits += int(logits[-1].argmax()) == token
        logits = lm.forward(torch.tensor([token]))
    return hits / len(wanted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a bench output folder with ar rows (greedy)")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--variants", default="int8@1024,int8@16,float32@1024", help="weights@prefill-block")
    parser.add_argument("--context", type=int, help="use one long prompt of this many tokens instead")
    parser.add_argument("--tokens", type=int, default=32, help="target tokens to follow with --context")
    args = parser.parse_args()
    run = Path(args.run)
    config = json.loads((run / "config.json").read_text())
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    wanted = {r["prompt_id"]: r["new_tokens"] for r in rows if r["method"] == "ar" and r["repeat"] == 0}
    variants = [(v.split("@")[0], int(v.split("@")[1])) for v in args.variants.split(",")]
    draft, tokenizer = load_model(config["draft"], config["dtype"])
    models = {"float32": copy.deepcopy(draft)} if any(w == "float32" for w, _ in variants) else {}
    models["int8"] = int8_draft(draft)
    if args.context:
        cases = [(f"{args.context}-token article prompt", *long_case(config, tokenizer, args.context, args.tokens))]
    else:
        prompts, _ = load_prompts(config["dataset"]["name"], Selection(limit=args.prompts))
        cases = [(p.id, torch.tensor(encode_prompt(tokenizer, p.text, raw=config["raw"])), wanted[p.id])
                 for p in prompts]
    scores: dict[str, list[float]] = {f"{w}@{c}": [] for w, c in variants}
    for name, ids, tokens in cases:
        for weights, chunk in variants:
            scores[f"{weights}@{chunk}"].append(agreement(models[weights], ids, tokens, chunk))
        print(name, f"{len(ids)} prompt tokens:", {v: round(s[-1], 3) for v, s in scores.items()}, flush=True)
    print("mean agreement over", len(cases), "prompts:", {v: round(sum(s) / len(s), 4) for v, s in scores.items()})


def long_case(config: dict, tokenizer, context: int, tokens: int) -> tuple[torch.Tensor, list[int]]:
    """The long prompt and the target's greedy continuation of it (prefilled as specdec does)."""
    target, _ = load_model(config["target"], config["dtype"])
    ids = torch.tensor(long_prompt(tokenizer, context))
    out = generate(target, ids, max_new_tokens=tokens, eos_token_id=[])
    return ids, out.new_tokens


if __name__ == "__main__":
    main()
