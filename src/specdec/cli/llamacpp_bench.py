"""`python -m specdec.cli.llamacpp_bench`: llama.cpp alone on a registry model's GGUF, plain
decoding against its prompt lookup, interleaved per prompt, with the first token where a lookup
output leaves plain decoding and the top-1/top-2 logit gap there (docs/llamacpp.md). llama.cpp
beside specdec's own methods: `specdec bench --methods ar,llamacpp,...`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..external.llamacpp import Generation, generate, load

if TYPE_CHECKING:
    from llama_cpp import Llama


def _hf_side(name: str):
    """The HF tokenizer and end ids of a registry model (its converted folder), for prompts and
    stopping exactly as specdec's benchmark does."""
    from transformers import AutoTokenizer, GenerationConfig

    from ..models.registry import REGISTRY, converted_folder

    folder = converted_folder(REGISTRY[name])
    eos = GenerationConfig.from_pretrained(folder).eos_token_id
    return AutoTokenizer.from_pretrained(folder), [eos] if isinstance(eos, int) else list(eos or [])


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two outputs differ (one may stop early); None when identical."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _gap_after(llm: Llama, ids: list[int]) -> float:
    """Top-1 minus top-2 logit for the token after `ids`, from one batch over them."""
    llm.reset()
    llm.eval(ids)
    top = np.sort(llm.scores[len(ids) - 1])[-2:]
    return float(top[1] - top[0])


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m specdec.cli.llamacpp_bench`: llama.cpp alone, with the first difference of each
    lookup output from plain decoding and the logit gap there (docs/llamacpp.md). Perplexity:
    `specdec perplexity`; llama.cpp beside specdec's methods: `specdec bench --methods ar,llamacpp`."""
    import argparse
    import json
    import statistics

    from ..bench.execute import WARMUP_TOKENS
    from ..machine import load_average
    from ..models.registry import DEFAULT_TARGET, gguf_file
    from ..prompts.chat import encode_prompt
    from ..prompts.datasets import Selection, load_prompts

    parser = argparse.ArgumentParser(prog="python -m specdec.cli.llamacpp_bench")
    parser.add_argument("--model", default=DEFAULT_TARGET)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's thread count")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lookup", default="10:2,2:3", help="k:max_ngram of each prompt-lookup run")
    args = parser.parse_args(argv)
    tokenizer, eos = _hf_side(args.model)
    path = gguf_file(args.model)
    prompts, _ = load_prompts(args.dataset, Selection(limit=args.limit))
    encoded = [encode_prompt(tokenizer, p.text) for p in prompts]
    engines = {"plain": load(path, n_threads=args.threads)}
    for spec in filter(None, args.lookup.split(",")):
        k, ngram = (int(x) for x in spec.split(":"))
        engines[f"lookup:k={k}:ngram={ngram}"] = load(path, n_threads=args.threads, lookup=(k, ngram))
    for llm in engines.values():  # discarded warm-up, as specdec's benchmark does
        generate(llm, encoded[0], WARMUP_TOKENS, eos)
    rows: dict[str, list[Generation]] = {name: [] for name in engines}
    for prompt, ids in zip(prompts, encoded):
        for name, llm in engines.items():  # interleaved per prompt
            out = generate(llm, ids, args.max_new_tokens, eos)
            rows[name].append(out)
            diff = _first_difference(out.new_tokens, rows["plain"][-1].new_tokens)
            # The top-1/top-2 logit gap where plain decoding went on, from a batch over the
            # common prefix (lookup engines keep all logits): a near-tie explains a flip.
            gap = _gap_after(llm, list(ids) + out.new_tokens[:diff]) if diff is not None and llm._logits_all else None
            print(json.dumps({"prompt": prompt.id, "method": name, "prompt_tokens": len(ids), "n_new": len(out.new_tokens),
                              "finish": out.finish_reason, "prefill_s": round(out.prefill_s, 3),
                              "tokens_per_s": out.tokens_per_s, "first_difference": diff, "gap": gap}), flush=True)
    for name, outs in rows.items():
        same = sum(o.new_tokens == p.new_tokens for o, p in zip(outs, rows["plain"]))
        speedups = [o.tokens_per_s / p.tokens_per_s for o, p in zip(outs, rows["plain"])]
        print(json.dumps({"method": name, "load_avg": load_average(), "median_tokens_per_s": statistics.median(o.tokens_per_s for o in outs),
                          "median_speedup": statistics.median(speedups), "same_as_plain": f"{same}/{len(outs)}"}))


if __name__ == "__main__":
    main()
