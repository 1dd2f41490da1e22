"""Measure the native runtime (docs/runtime.md): read bandwidth, the int4 1.5B target's plain
decode step against today's path (transformers + QuantLinear through CausalLM), the 0.5B
draft's step (int4 with the full and a 32768-id head, int3 with the 32768-id head), a step's
profile, where a forward's time goes by stage over 1-16 rows (`--parts rows`: a block of one
sequence and one row each of n lanes, target and int3 draft; `--sizes` for other row counts,
`--rows-context` for the tokens each lane holds before them),
prefill tokens/s of a long prompt by stage (`--parts prefill`: the HumanEval prompts' text cut
to `--prefill-tokens`), and optionally paired tok/s of plain decoding against draft:k=3 on
HumanEval prompts. `--kernels DIR` builds the native decoder from DIR's decoder.cpp and
qgemm.cpp instead (another version of the kernels, for an A/B: scripts/measure/prefill_ab.sh).
Run under the CPU lock:

    flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/measure/runtime_bench.py [--parts ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec import DraftModel, generate
from specdec.runtime.hf.causal_lm import CausalLM
from specdec.models.draft_head import bundled_text_tokens, frequent_tokens
from specdec.models.load import load_model, load_tokenizer
from specdec.prompts.chat import encode_prompt
from specdec.prompts.datasets import dataset_path, read_prompts
from specdec.runtime import load_gguf
from specdec.runtime.native.decoder import stage_seconds

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def cpu() -> dict:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    name = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in info if line.startswith("flags"))
    wanted = [f for f in flags if f.startswith(("avx512", "avx2", "amx", "fma"))]
    return {"model": name, "flags": wanted, "threads": torch.get_num_threads()}


def bandwidth(gib: int = 3, repeats: int = 7) -> float:
    """GB/s of a float32 tensor's .sum() over `gib` GiB (median, first run discarded)."""
    x = torch.ones(gib * (1 << 30) // 4)
    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - began)
    return x.numel() * 4 / statistics.median(times[1:]) / 1e9


def steps(lm, prompt: torch.Tensor, count: int) -> list[float]:
    """Seconds of each of `count` greedy decode steps after prefilling `prompt`."""
    token = lm.prefill(prompt)[-1].argmax().view(1)
    out = []
    for _ in range(count):
        began = time.perf_counter()
        token = lm.forward(token, last_only=True)[-1].argmax().view(1)
        out.append(time.perf_counter() - began)
    return out


def paired_steps(lms: dict, prompt: torch.Tensor, rounds: int = 5, count: int = 16) -> dict[str, float]:
    """Median decode-step ms of each model, measured in interleaved blocks (first block of each
    discarded as warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in lms}
    for r in range(rounds + 1):
        for name, lm in lms.items():
            block = steps(lm, prompt, count)
            if r:
                times[name] += block
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def profile(lm, prompt: torch.Tensor, count: int = 32) -> dict:
    steps(lm, prompt, 4)
    token = lm.prefill(prompt)[-1].argmax().view(1)
    stage_seconds()
    began = time.perf_counter()
    for _ in range(count):
        token = lm.forward(token, last_only=True)[-1].argmax().view(1)
    wall = (time.perf_counter() - began) / count
    stages = {k: 1e3 * v / count for k, v in stage_seconds().items()}
    kernels = sum(stages[k] for k in ("qkv", "o", "gate_up", "down", "head"))
    return {"step_ms": 1e3 * wall, "stages_ms": stages, "kernels_ms": kernels,
            "other_c_ms": sum(stages.values()) - kernels, "python_glue_ms": 1e3 * wall - sum(stages.values())}


def row_profiles(lm, prompt: torch.Tensor, sizes=(1, 2, 4, 8, 16), repeats: int = 9) -> dict:
    """Median ms per stage of one forward over n rows after the prompt: a block of n rows of one
    sequence (a verify block, a prompt chunk) and n lanes of one row each (a batch's plain rows,
    a draft step's), the first reading of each discarded. Each n-row forward is paired with a
    one-row forward of the same lane next to it (the order alternating): `ratio_to_one` is the
    median of those pairs' ratios, which a change in the machine's memory speed during the run
    (a shared host's) moves on both sides alike."""
    from specdec.decode.batch import forward_blocks

    lanes = [lm.lane(prompt.numel() + 2 * max(sizes)) for _ in range(max(sizes))]
    for lane in lanes:
        lane.prefill(prompt)

    def timed(blocks) -> dict:
        stage_seconds()
        began = time.perf_counter()
        forward_blocks(blocks)
        wall, stages = time.perf_counter() - began, stage_seconds()
        for lane, _, _ in blocks:
            lane.trim(prompt.numel())
        return {"wall": wall, **stages}

    out = {}
    for kind in ("block", "lanes"):
        for n in sizes:
            blocks = ([(lanes[0], prompt[:n], False)] if kind == "block"
                      else [(lane, prompt[:1], False) for lane in lanes[:n]])
            one = [(lanes[0], prompt[:1], False)]
            readings, ratios = [], []
            for at in range(repeats + 1):
                if at % 2:
                    many = timed(blocks)
                    alone = timed(one)
                else:
                    alone = timed(one)
                    many = timed(blocks)
                if at:
                    readings.append(many)
                    ratios.append(many["wall"] / alone["wall"])
            out[f"{kind} {n}"] = {k: round(1e3 * statistics.median(r[k] for r in readings), 2) for k in readings[0]}
            out[f"{kind} {n}"]["ratio_to_one"] = round(statistics.median(ratios), 3)
    for lane in lanes:
        lane.release()
    return out


def prefill_profile(lm, prompt: torch.Tensor, repeats: int = 3) -> dict:
    """Median seconds of a prefill of `prompt` from an empty cache, and ms per stage (the first
    prefill discarded as warm-up)."""
    readings = []
    for at in range(repeats + 1):
        stage_seconds()
        began = time.perf_counter()
        lm.prefill(prompt)
        wall, stages = time.perf_counter() - began, stage_seconds()
        if at:
            readings.append({"wall": wall, **stages})
    wall = statistics.median(r["wall"] for r in readings)
    return {"tokens": prompt.numel(), "seconds": [round(r["wall"], 3) for r in readings],
            "tokens_per_s": prompt.numel() / wall,
            "stages_ms": {k: round(1e3 * statistics.median(r[k] for r in readings), 1) for k in readings[0]}}


def long_prompt(tokenizer, tokens: int) -> torch.Tensor:
    """The first `tokens` tokens of the HumanEval prompts' text, one after another."""
    text = "\n".join(p.text for p in read_prompts(dataset_path("humaneval")))
    ids = tokenizer(text)["input_ids"]
    if len(ids) < tokens:
        raise SystemExit(f"--prefill-tokens {tokens}: the HumanEval text has only {len(ids)} tokens")
    return torch.tensor(ids[:tokens])


def int3_draft(tokenizer):
    """The default proposer's draft: the int3 0.5B with its head restricted to the bundled text's
    32,768 most frequent ids (of the target's vocabulary, read from its GGUF's metadata)."""
    from specdec.gguf import gguf_path, prepared

    vocab = prepared(gguf_path(TARGET))[1].config.vocab
    keep = frequent_tokens(bundled_text_tokens(tokenizer), 32768, vocab, tokenizer.all_special_ids)
    return load_gguf(DRAFT, "int3", head_ids=keep)


def use_kernels(folder: Path) -> None:
    """Build the native decoder from `folder`'s decoder.cpp and qgemm.cpp (before anything loads)."""
    from specdec import kernels
    from specdec.runtime.native import decoder

    for name in ("decoder.cpp", "qgemm.cpp"):
        if not (folder / name).is_file():
            raise SystemExit(f"--kernels {folder}: no {name} there (copy both from a checkout of the version to time)")
    kernels.SOURCE, decoder.SOURCE = folder.resolve() / "qgemm.cpp", folder.resolve() / "decoder.cpp"


def humaneval(tokenizer, count: int) -> list[torch.Tensor]:
    prompts = read_prompts(dataset_path("humaneval"))[:count]
    return [torch.tensor(encode_prompt(tokenizer, p.text)) for p in prompts]


def tok_per_s(target, draft, prompts: list[torch.Tensor], new: int) -> dict:
    """Paired plain vs draft:k=3 tok/s per prompt (each pair run twice, the first discarded)."""
    rows = []
    for prompt in prompts:
        pair = {}
        for _ in range(2):
            plain = generate(target, prompt, max_new_tokens=new)
            spec = generate(target, prompt, drafter=DraftModel(draft, k=3), max_new_tokens=new)
            pair = {"ar": plain.stats.tokens_per_s, "draft_k3": spec.stats.tokens_per_s,
                    "equal": plain.new_tokens == spec.new_tokens, "tokens": len(plain.new_tokens),
                    "accepted_per_round": spec.stats.accepted / max(spec.stats.rounds, 1)}
        rows.append(pair)
    speedups = [r["draft_k3"] / r["ar"] for r in rows]
    return {"prompts": rows, "median_speedup": statistics.median(speedups)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", nargs="+", default=["bandwidth", "target", "draft", "profile"],
                        choices=["bandwidth", "target", "draft", "profile", "rows", "prefill", "toks"])
    parser.add_argument("--sizes", default="1,2,4,8,16", help="row counts of --parts rows, comma-separated")
    parser.add_argument("--rows-context", type=int, default=0,
                        help="--parts rows after this many tokens of the HumanEval text in each lane (default: "
                             "HumanEval/0's chat prompt, ~150 tokens)")
    parser.add_argument("--prefill-tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="prefills timed per model (after one warm-up)")
    parser.add_argument("--kernels", type=Path, help="a folder with another decoder.cpp and qgemm.cpp to build")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--out", default="/tmp/runtime_bench.json")
    args = parser.parse_args()
    if args.kernels:
        use_kernels(args.kernels)
    sizes = tuple(int(n) for n in args.sizes.split(","))
    tokenizer = load_tokenizer(TARGET)
    prompt = humaneval(tokenizer, 1)[0]
    rows_prompt = long_prompt(tokenizer, args.rows_context) if args.rows_context else prompt
    report: dict = {"cpu": cpu(), "prompt_tokens": prompt.numel(), "rows_context": rows_prompt.numel(),
                    "kernels": str(args.kernels or "specdec's")}
    if "bandwidth" in args.parts:
        report["read_GBps"] = bandwidth()
    target = load_gguf(TARGET, "int4")
    weights = target.decoder.weights
    report["target_forms"] = sorted(set(weights.forms.values()))
    if "target" in args.parts:
        today = CausalLM(load_model(TARGET, "bfloat16", quant="int4")[0])
        ms = paired_steps({"native": target, "today_bf16": today}, prompt)
        context = prompt.numel() + 48
        per_step = target.weight_bytes() + target.kv_bytes(context)
        report["target"] = {"step_ms": ms, "bytes_per_step": per_step,
                            "GBps_native": per_step / ms["native"] / 1e6}
        del today
    if "profile" in args.parts:
        report["profile_target"] = profile(target, prompt)
    if "rows" in args.parts:
        report["rows_target"] = row_profiles(target, rows_prompt, sizes)
    if "prefill" in args.parts:
        report["prefill_target"] = prefill_profile(target, long_prompt(tokenizer, args.prefill_tokens), args.repeats)
    if {"draft", "rows", "prefill", "toks"} & set(args.parts):
        draft = load_gguf(DRAFT, "int4")
        keep = frequent_tokens(bundled_text_tokens(tokenizer), 32768, draft.vocab_size, tokenizer.all_special_ids)
        small = load_gguf(DRAFT, "int4", head_ids=keep)
        if "draft" in args.parts:
            drafts = {"draft_full": draft, "draft_32768": small,
                      "draft_int3_32768": load_gguf(DRAFT, "int3", head_ids=keep)}
            ms = paired_steps({"target": target, **drafts}, prompt)
            report["draft"] = {"step_ms": ms, **{f"fraction{n.removeprefix('draft')}": ms[n] / ms["target"]
                                                 for n in drafts},
                               "weight_bytes": {n: d.weight_bytes() for n, d in drafts.items()}}
            report["profile_draft_32768"] = profile(small, prompt)
            report["profile_draft_int3_32768"] = profile(drafts["draft_int3_32768"], prompt)
        int3 = load_gguf(DRAFT, "int3", head_ids=keep) if {"rows", "prefill"} & set(args.parts) else None
        if "rows" in args.parts:
            report["rows_draft_int3_32768"] = row_profiles(int3, rows_prompt, sizes)
        if "prefill" in args.parts:
            report["prefill_draft_int3_32768"] = prefill_profile(int3, long_prompt(tokenizer, args.prefill_tokens),
                                                                 args.repeats)
        if "toks" in args.parts:
            report["toks"] = tok_per_s(target, small, humaneval(tokenizer, args.prompts), args.new)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
