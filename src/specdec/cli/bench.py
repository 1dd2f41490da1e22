"""`specdec bench`, the paired benchmark, and `specdec report DIR`, which rebuilds its summary
and report: arguments -> configuration -> runs (specdec.bench) -> summary -> report."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..errors import SpecdecError
from ..methods.kinds import KINDS
from ..methods.spec import Method
from ..load.choose import choose, pay_advice
from ..load.loaded import to_stderr
from ..load.models import load_drafts, load_target
from ..load.spec import PLAIN
from .args import draft_flags, spec_of
from .flags import add_model_args, add_sampling_args
from .bench_endpoints import bench_endpoints, finished_methods, keep_server_logs, served_endpoints
from .options import at_least_one

DEFAULT_METHODS = "ar,draft,lookup"
METHODS_HELP = (
    "comma list of method specs, KIND[:OPTION=VALUE]...: "
    + "; ".join(f"{name} ({', '.join(kind.options) or 'no options'})" for name, kind in KINDS.items())
    + ". E.g. ar,draft:k=2:quant=int8,draft:k=4:conf=0.7,lookup:k=8:ngram=3,hybrid:k=2,hf-assisted:k=2,llamacpp. "
    "llamacpp: llama.cpp's greedy decoding of the (registry) target's GGUF, llamacpp-lookup its prompt lookup. "
    "k defaults to 2, ngram to 3; cat=1 on a specdec method: transformers' concatenating KV cache instead "
    "of the preallocated one"
)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="paired benchmark of decoding methods over a dataset",
        description="Runs every method on every prompt, interleaved, and writes config.json, "
        "results.jsonl (one row per run), summary.json and report.md with plots into --out.",
    )
    b.add_argument("--dataset", required=True, help="humaneval, mt-bench, spec-bench (bundled), or a JSONL file (turns or prompt "
                   "field); with --conversations also code-edit")
    b.add_argument("--conversations", action="store_true",
                   help="multi-turn conversations against the endpoints: every turn of each record with two or more "
                        "(mt-bench, spec-bench) or code-edit's four (a ~150-line standard-library module pasted, an edit "
                        "that repeats it, tests, a summary), each answer the server's own and the history resent every "
                        "turn, through the openai client, greedy; a row per conversation and server")
    b.add_argument("--categories", help="comma list: keep only these categories")
    b.add_argument("--per-category", type=int, help="keep the first N prompts of each category")
    b.add_argument("--limit", type=int, help="keep the first N prompts (after the filters above)")
    b.add_argument("--methods", default=None,
                   help=METHODS_HELP + f". Default: {DEFAULT_METHODS}, or none where --endpoint is given")
    b.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                   help="an OpenAI-compatible server to measure beside (or instead of) the methods, as method "
                        "endpoint:name=NAME: URL is its /v1/completions (prompt ids from --target's tokenizer) or "
                        "/v1/chat/completions (the prompt's text); repeatable")
    b.add_argument("--baseline", action="append", default=[], metavar="NAME[=OTHER,...]",
                   help="the endpoint whose speed and output the other endpoints are compared with; NAME=OTHER,... "
                   "for those endpoints only, repeatable, so that each engine's speculative servers are compared with "
                   "its own plain server (e.g. --baseline llama=llama-spec --baseline vllm=vllm-ngram,vllm-draft); "
                   "specdec's own methods are compared with ar")
    b.add_argument("--serve", action="append", default=[], metavar="NAME=OPTIONS",
                   help="an endpoint NAME that bench starts itself: `specdec serve --target T --draft D OPTIONS` on a "
                        "free loopback port (T, D: bench's --target and --draft; OPTIONS: serve's, e.g. --proposer ar "
                        "or --proposer auto --target-quant int4; they may override T and D), measured as --endpoint "
                        "NAME=its URL once /health answers, stopped when the bench ends; its log goes to "
                        "--out/server-NAME.log; repeatable")
    b.add_argument("--serve-api", choices=["completions", "chat"], default="completions",
                   help="the API of every --serve endpoint: /v1/completions (prompt ids) or /v1/chat/completions "
                        "(the prompt's text, the server's chat template)")
    b.add_argument("--client", choices=["httpx", "openai"], default="httpx",
                   help="what sends the endpoints' requests and reads their streams: httpx (default) or the official "
                        "openai package (its parsed chunks timed as an application using it sees them)")
    b.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="endpoints only: N requests at once (consecutive prompts), to see the speedup under load")
    b.add_argument("--arrival-gap", type=float, default=0.0, metavar="S",
                   help="with --concurrency: a wave's requests sent one after another at Poisson times, the gaps "
                        "exponential with mean S seconds (the same arrivals for every endpoint), instead of all "
                        "at once (default 0)")
    b.add_argument("--endpoint-timeout", type=float, default=300.0, metavar="S",
                   help="seconds an endpoint may stay silent (to connect, or between two stream chunks)")
    b.add_argument("--max-ngram", type=int, default=None, help="ngram=N for every method that takes it")
    b.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt")
    b.add_argument("--out", required=True, help="output folder (must be new or empty unless --resume)")
    b.add_argument("--resume", action="store_true", help="continue a run in --out, skipping finished rows")
    b.add_argument("--raw", action="store_true", help="do not apply the chat template")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--pay-rule", metavar="FILE",
                   help="cost terms for methods with pay=1: the JSON of `specdec advise --json` for this pair")
    add_model_args(b, "draft model of draft, hybrid and hf-assisted methods", target_quant="none")
    add_sampling_args(b)
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("report", help="rebuild summary.json and report.md of a bench folder from its rows")
    r.add_argument("dir", help="a folder written by specdec bench")
    r.set_defaults(func=cmd_report)


def cmd_bench(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    if args.conversations:
        from .bench_conversation import cmd_conversations

        return cmd_conversations(args)
    servers = served_endpoints(args)  # not started yet: the arguments are checked first
    out = Path(args.out)
    if servers and not args.resume and out.is_dir() and any(out.iterdir()):  # before minutes of model loading
        raise SpecdecError(f"--out {out} is not empty: pass --resume to continue the run there, or choose a new folder")
    accepted = []  # set once --out is accepted: only then do the servers' logs go there
    try:
        with ExitStack() as stack:
            return _bench(args, lambda: [stack.enter_context(s) for s in servers.values()], accepted)
    finally:  # the servers stopped: their logs have what they print when they stop
        if accepted:
            keep_server_logs(servers, out)


def _bench(args: argparse.Namespace, start_servers, accepted: list) -> int:
    """The bench itself; `start_servers()` starts the --serve endpoints (just before they are
    probed); `accepted` gets an entry once --out is accepted."""
    import torch

    from ..bench.agreement import REFERENCE, explain_differences
    from ..bench.endpoint import EndpointExecutor, EndpointSettings, Routed, explain_endpoint_differences
    from ..bench.execute import Executor, RunSettings, check_llamacpp
    from ..bench.report import REPORT, report_folder
    from ..bench.runner import EncodedPrompt, run_bench
    from ..bench.store import RESULTS, check_out_dir, read_rows
    from ..decode.sampling import SamplingConfig
    from ..machine import PeakMemory
    from ..methods.spec import parse, parse_list
    from ..models.load import eos_of, load_tokenizer
    from ..prompts.chat import encode_prompt
    from ..prompts.datasets import Selection, load_prompts

    text = args.methods if args.methods is not None else "" if args.endpoint else DEFAULT_METHODS
    local = parse_list(text, {**draft_flags(args), "ngram": ("--max-ngram", args.max_ngram)}) if text else []
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.min_p)  # validates them
    at_least_one(args, "repeats", "max_new_tokens", "concurrency")
    endpoints, baselines = bench_endpoints(args, local, sampling)
    methods = local + [parse(f"endpoint:name={e.name}") for e in endpoints]
    if args.pay_rule and not any(m.pay for m in methods):
        raise SpecdecError("--pay-rule applies to no method in --methods: add pay=1 to a draft method")
    check_llamacpp([m for m in methods if m.is_llamacpp], args.target, sampling)  # before the slow part
    prompts, path = load_prompts(args.dataset, Selection(_split(args.categories), args.per_category, args.limit))
    out = Path(args.out)
    memory = PeakMemory(torch.device(args.device))
    # `auto` is resolved once, before anything runs; the choice is part of the configuration.
    auto_method = next((m for m in methods if m.kind == "auto"), None)
    choices = choose(spec_of(args, auto_method or PLAIN, args.pay_rule))
    auto = choices.method if auto_method else None
    config = bench_config(args, methods, prompts, path, memory.kind, choices.record(), auto)
    if auto:
        config["auto"] = {"runs": auto.label, "why": choices.auto_line}
    if args.client != "httpx" and not endpoints:
        raise SpecdecError("--client applies to endpoints: add --endpoint NAME=URL or --serve NAME=OPTIONS")
    remote = EndpointExecutor(endpoints, EndpointSettings(args.max_new_tokens, args.endpoint_timeout, client=args.client,
                                                          sampling=sampling, seed=args.seed,
                                                          arrival_gap_s=args.arrival_gap), {}) if endpoints else None
    finished = finished_methods(out, prompts, args.repeats) if args.resume else {}
    if remote:  # probed before the slow part: a server that is down is an error at once
        for server in start_servers():
            print(f"[specdec bench] started: {shlex.join(server.command)}", file=sys.stderr)
        config.update(endpoints=remote.prepare(finished), baselines=baselines, concurrency=args.concurrency)
        if args.arrival_gap:
            config["arrival_gap_s"] = args.arrival_gap
        config["environment"]["endpoint_urls"] = remote.urls()
    # Checked before the models load (slow), so a refused folder is refused at once.
    check_out_dir(out, config, args.resume)
    accepted.append(out)

    advice = pay_advice(choices)
    local_todo = [m for m in local if m.label not in finished]  # a resumed run loads no model it will not run
    target, tokenizer = (load_target(choices, to_stderr) if local_todo
                         else (None, load_tokenizer(args.target, args.trust_remote_code)))
    executor = None
    if local_todo:
        drafts = load_drafts(choices.spec, target, tokenizer, _resolved(local, auto))
        settings = RunSettings(args.max_new_tokens, sampling, args.seed, eos_of(target))
        executor = Executor(target, drafts, settings, memory, auto, advice, target_name=args.target)
        executor.prepare(local)
    encoded = [EncodedPrompt(p, encode_prompt(tokenizer, p.text, raw=args.raw)) for p in prompts]
    if remote:
        remote.texts.update({tuple(e.ids): e.prompt.text for e in encoded})
        remote.rendered.update({tuple(e.ids): tokenizer.decode(e.ids) for e in encoded})
    try:
        run_bench(out, config, encoded, methods, args.repeats, Routed(executor, remote),
                  progress=not args.no_progress, concurrency=args.concurrency)
        if remote and baselines and sampling.greedy:  # each difference between servers, with its gap (re-asked)
            explain_endpoint_differences(out, remote, {e.prompt.id: e.ids for e in encoded}, baselines)
    except KeyboardInterrupt:
        print(f"\nspecdec: interrupted; the {len(read_rows(out))} finished rows are kept in {out / RESULTS}.\n"
              f"resume with: {_resume_command()}", file=sys.stderr)
        return 130
    except SpecdecError as e:  # an endpoint failed: what was measured stays, and can be continued
        raise SpecdecError(f"{e} ({len(read_rows(out))} finished rows kept in {out / RESULTS}; "
                           f"continue with: {_resume_command()})") from None
    finally:
        if remote:
            remote.close()
    if sampling.greedy and target is not None and any(m.kind == REFERENCE for m in methods):
        explain_differences(out, target, {e.prompt.id: e.ids for e in encoded})
    print(_digest(report_folder(out)) + f"\nreport: {out / REPORT}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..bench.report import REPORT, report_folder
    from ..bench.store import CONFIG
    from ..files import read_json

    out = Path(args.dir)
    if not (out / CONFIG).is_file():
        raise SpecdecError(f"{out} is not a specdec bench folder: it has no {CONFIG}")
    if read_json(out / CONFIG).get("kind") == "conversations":
        from .bench_conversation import conversation_report

        print(conversation_report(out), file=sys.stderr)
        return 0
    print(_digest(report_folder(out)) + f"\nreport: {out / REPORT}", file=sys.stderr)
    return 0


def _resolved(methods: list[Method], auto: Method | None) -> list[Method]:
    return [auto if m.kind == "auto" else m for m in methods]


def bench_config(args: argparse.Namespace, methods: list[Method], prompts, dataset_file: Path, memory_kind: str,
                 quant: dict, auto: Method | None = None) -> dict:
    """Everything that makes two runs' rows comparable (`quant`: the target's form and runtime,
    specdec.load.choose.Choices.record); --resume refuses a folder whose config differs (but for
    when it started: store.VOLATILE)."""
    from ..bench.execute import WARMUP_TOKENS
    from ..machine import KINDS, environment
    from ..models.load import resolve_dtype
    from ..prompts.datasets import file_sha256

    labels = [m.label for m in methods]
    dtype = resolve_dtype(args.dtype, args.device)
    return {
        "target": args.target,
        "draft": args.draft if any(m.uses_draft for m in _resolved(methods, auto)) else None,
        "pay_rule": {"file": args.pay_rule, "sha256": file_sha256(Path(args.pay_rule))} if args.pay_rule else None,
        "dtype": dtype,
        "device": args.device,
        "methods": labels,
        "dataset": {"name": args.dataset, "sha256": file_sha256(dataset_file)},
        "selection": {"categories": _split(args.categories), "per_category": args.per_category, "limit": args.limit},
        "prompt_ids": [p.id for p in prompts],
        "raw": args.raw,
        "max_new_tokens": args.max_new_tokens,
        "sampling": {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                     "seed": args.seed},
        "repeats": args.repeats,
        "warmup_tokens": min(WARMUP_TOKENS, args.max_new_tokens),
        "memory": {"kind": memory_kind, "meaning": KINDS[memory_kind]},
        "environment": environment(args.device, dtype, labels + ([auto.label] if auto else []), quant),
    }


def _split(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def _resume_command() -> str:
    argv = sys.argv[1:]
    return shlex.join(["specdec", *argv, *([] if "--resume" in argv else ["--resume"])])


def _digest(summary: dict) -> str:
    """A few lines for the terminal; the full picture is in report.md."""
    lines = [f"[specdec bench] {summary['overall']['n_prompts']} prompts"]
    for label, m in summary["overall"]["methods"].items():
        tps = m["tokens_per_s"]["median"] if m["tokens_per_s"] else float("nan")
        s = m["speedup"]
        speed = f", speedup {s['median']:.2f} [{s['ci95_median'][0]:.2f}, {s['ci95_median'][1]:.2f}]" if s else ""
        mal = m["mean_accepted_length"]
        agg, ttft = m.get("aggregate_tokens_per_s"), m.get("ttft_s")
        load = (f", in all {agg['median']:.2f} tok/s, TTFT p50 {ttft['p50']:.2f} s p99 {ttft['p99']:.2f} s"
                if agg and ttft else "")
        lines.append(f"  {label:<24} {tps:7.2f} tok/s{speed}" + (f", mean accepted length {mal:.2f}" if mal else "")
                     + load)
    return "\n".join(lines)
