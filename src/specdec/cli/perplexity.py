"""`specdec perplexity`: what quantization costs, on the same token windows for every engine.

Engines: `llamacpp` (llama.cpp on the target's own GGUF, logits of every position) and specdec's
target as loaded by `--target-quant`: `none` (the dequantized weights in --dtype), `int8`,
`int4`. Each scores the leading --tokens tokens of Spec-Bench's news articles with the sliding
windows of specdec.external.llamacpp.windows (window --window, a new one every --stride), NLL in float64
(specdec.external.llamacpp.nll / transformers_nll). One JSON line per engine, then a table with each
engine's perplexity relative to the first one.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from ..errors import SpecdecError
from ..quant import MODES
from .options import at_least_one

ENGINES = ("llamacpp", *MODES)


def register(sub: argparse._SubParsersAction) -> None:
    from ..models.load import DEFAULT_TARGET, DTYPES

    p = sub.add_parser("perplexity", help="perplexity of llama.cpp and of the bf16/int8/int4 target on the same text",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--target", default=DEFAULT_TARGET, help="registry name (llamacpp needs its GGUF) or HF folder")
    p.add_argument("--engines", default="llamacpp,none,int4",
                   help=f"comma list of {', '.join(ENGINES)} (none: the dequantized target in --dtype)")
    p.add_argument("--tokens", type=int, default=20480, help="leading tokens of the articles to score")
    p.add_argument("--window", type=int, default=2048)
    p.add_argument("--stride", type=int, default=1024)
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    p.add_argument("--quant-group", type=int, default=32, help="int4 group size for a folder target")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="JSON lines only, no table")
    p.set_defaults(func=cmd_perplexity)


def cmd_perplexity(args: argparse.Namespace) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise SpecdecError(f"--engines takes a comma list of {', '.join(ENGINES)}, got {args.engines!r}")
    at_least_one(args, "tokens", "window", "stride")
    if "llamacpp" in engines:
        from ..bench.execute import check_llamacpp
        from ..decode.sampling import SamplingConfig
        from ..methods.spec import Method

        check_llamacpp([Method("llamacpp")], args.target, SamplingConfig())
    ids = article_ids(args.target, args.tokens)
    results = [score(engine, ids, args) for engine in engines]
    if not args.json:
        print(table(results), file=sys.stderr)
    return 0


def article_ids(target: str, tokens: int) -> list[int]:
    """The leading `tokens` token ids of the bundled news articles, by the target's tokenizer."""
    from ..models.load import load_tokenizer
    from ..prompts.long import articles

    tokenizer = load_tokenizer(target)
    return tokenizer("\n\n".join(articles()), add_special_tokens=False)["input_ids"][:tokens]


def score(engine: str, ids: list[int], args: argparse.Namespace) -> dict:
    """One engine's NLL over the windows, printed as a JSON line and returned."""
    from ..external import llamacpp
    from ..machine import load_average
    from ..models.load import load_model, resolve_dtype

    start = time.perf_counter()
    if engine == "llamacpp":
        from ..gguf import gguf_path

        llm = llamacpp.load(gguf_path(args.target), n_ctx=args.window, n_threads=args.threads, logits_all=True)
        result = llamacpp.nll(llm, ids, args.window, args.stride, progress=True)
        label = "llama.cpp (GGUF)"
        del llm
    else:
        model, _ = load_model(args.target, args.dtype, quant=engine, group=args.quant_group)
        result = llamacpp.transformers_nll(model, ids, args.window, args.stride, progress=True)
        label = f"specdec {resolve_dtype(args.dtype)}" + ("" if engine == "none" else f" {engine}")
        del model
    gc.collect()
    row = {"engine": engine, "label": label, "target": args.target, "tokens": len(ids), "scored": result.n_scored,
           "window": args.window, "stride": args.stride, "nll_per_token": result.total / result.n_scored,
           "perplexity": result.perplexity, "seconds": round(time.perf_counter() - start, 1),
           "load_avg": load_average()}
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = [f"| engine | perplexity | vs {base['label']} |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['perplexity']:.3f} | {100 * (r['perplexity'] / base['perplexity'] - 1):+.2f}% |")
    return "\n".join(lines)
