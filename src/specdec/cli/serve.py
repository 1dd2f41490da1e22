"""`specdec serve`: an OpenAI-compatible server that decodes speculatively (specdec.serve)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from ..errors import SpecdecError
from ..methods.spec import in_conversation
from .flags import add_method_args, add_model_args, add_sampling_args
from .options import at_least_one

API_KEY_ENV = "SPECDEC_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server that decodes speculatively",
                       description="POST /v1/completions and /v1/chat/completions (streamed or not), GET /v1/models, "
                                   "/health, /metrics; every reply carries its speculation figures (`timings`). "
                                   "The sampling options are the defaults for requests that leave them out.")
    add_model_args(s)
    add_method_args(s, default="auto")
    add_sampling_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback only; another address prints a warning without "
                        "--api-key)")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require `Authorization: Bearer KEY` on every route but /health (default: ${API_KEY_ENV})")
    s.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients name (default: --target as given)")
    s.add_argument("--max-sequences", type=int, default=8, metavar="N",
                   help="requests decoded together (continuous batching; default 8; 1: one at a time)")
    s.add_argument("--kv-tokens", type=int, default=32768, metavar="T",
                   help="cache positions the running requests may hold together, each claiming them as it grows "
                        "(default 32768; docs/serving.md gives the bytes per position); when they are all held, "
                        "the request that asked for the most waits and later resumes; a request that could not "
                        "fit alone gets 400")
    s.add_argument("--no-prefix-cache", action="store_true",
                   help="forward every prompt whole: by default an ended request's K/V stay in the cache (within "
                        "--kv-tokens, least recently used evicted first) and a later prompt that starts the same "
                        "way (a conversation's next turn, a shared system prompt) forwards only the rest")
    s.add_argument("--no-plan", action="store_true",
                   help="guess the proposer's k every round instead of the cost model's choice per request")
    s.add_argument("--round-rows", type=int, default=None, metavar="N",
                   help="chunked prefill: a request that arrives while others decode has its prompt forwarded "
                        "inside their rounds, each round's target forward filled up to N rows (at least N/4 of "
                        "prompt), so their streams stall for one such round, not a whole prefill, and its first "
                        "token comes later (default 64; 0: prefilled alone, their rounds waiting for it)")
    s.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait while others decode; more get 503 with Retry-After (default 16)")
    s.add_argument("--request-timeout", type=float, default=None, metavar="S",
                   help="seconds a request may take from its arrival: past them a waiting one gets 503, a running "
                        "one ends with what it generated, finish_reason abort (default: no limit)")
    s.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM or Ctrl-C, seconds the running requests get to finish before they end with "
                        "finish_reason abort; new ones get 503 at once (default 30)")
    s.add_argument("--max-body-bytes", type=int, default=8 << 20,
                   help="larger request bodies get 413 (default 8 MiB)")
    s.add_argument("--allowed-origins", default=None, metavar="LIST",
                   help="web origins whose pages may call the server, comma separated (e.g. "
                        "http://localhost:3000; * allows every origin): they get CORS headers; a request from any "
                        "other origin (it carries an Origin header) gets 403 (default: none; clients outside a "
                        "browser send no Origin)")
    s.add_argument("--allowed-hosts", default=None, metavar="LIST",
                   help="Host names the server answers besides its own, comma separated (* for any): a server on "
                        "loopback answers only localhost, 127.0.0.1 and [::1] by default (against DNS rebinding); "
                        "given, the check holds on any address")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (debug also logs every request)")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    server, worker = build_server(args)
    warning = host_warning(args.host, server_key(args))
    if warning:
        print(warning, file=sys.stderr)
    worker.start()
    # uvicorn shuts down cleanly on SIGINT/SIGTERM, then raises the signal again for the caller:
    # here that is the end of a normal stop, not an error.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        server.run()
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        worker.stop()
        worker.join(worker.limits.shutdown_timeout + 5)
    return 2 if worker.state in ("failed", "dead") else 0


class _Stopped(Exception):
    pass


def _stopped(signum, frame) -> None:
    raise _Stopped


def host_warning(host: str, key: str | None) -> str | None:
    """The warning for an address beyond loopback without an API key (None: nothing to warn)."""
    from ..serve.server import is_loopback

    if is_loopback(host) or key:
        return None
    return (f"[specdec] warning: listening on {host} without an API key: anyone who reaches this address can use "
            f"the model; pass --api-key KEY or set {API_KEY_ENV}")


def sites_of(args: argparse.Namespace):
    """The origins and Host names the server answers (serve.security.Sites), from the flags."""
    from ..serve.security import Sites, parse_hosts, parse_origins

    try:
        return Sites(parse_origins(args.allowed_origins), parse_hosts(args.allowed_hosts), args.host)
    except ValueError as e:
        raise SpecdecError(str(e)) from None


def server_key(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def build_server(args: argparse.Namespace):
    """The uvicorn server and the decode worker (not started) for these arguments. The models load
    in the worker through specdec.load, as `specdec generate` loads them."""
    from ..decode.plan import measured_plan
    from ..decode.sampling import SamplingConfig
    from ..load.loaded import load as load_models
    from ..serve.app import Settings
    from ..serve.metrics import ServerMetrics
    from ..serve.request import Defaults
    from ..serve.server import build
    from ..serve.worker import ROUND_ROWS, DecodeWorker, Limits, Loaded
    from .args import method_of, spec_of

    at_least_one(args, "max_new_tokens", "max_queue", "max_body_bytes", "max_sequences", "kv_tokens")
    if args.round_rows is not None and args.round_rows < 0:
        raise SpecdecError(f"--round-rows must be >= 0 (0: no chunked prefill), got {args.round_rows}")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise SpecdecError(f"--request-timeout must be > 0 seconds, got {args.request_timeout}")
    if not args.shutdown_timeout >= 0:
        raise SpecdecError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    if not 0 <= args.port <= 65535:
        raise SpecdecError(f"--port must be in 0..65535, got {args.port}")
    SamplingConfig(args.temperature, args.top_k, args.top_p)  # the defaults' one-line errors, before loading
    spec = spec_of(args, in_conversation(method_of(args)), args.pay_rule)
    defaults = Defaults(max_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, min_p=getattr(args, "min_p", None) or None, seed=args.seed)
    name = args.served_model_name or args.target

    def load() -> Loaded:
        models = load_models(spec)  # `auto` resolved
        lm, drafter = models.lm(), models.proposer
        plan = None if args.no_plan or drafter is None else measured_plan(lm, drafter)
        if plan is not None:  # what the plan's choices under load follow: worth seeing when they surprise
            print(f"[specdec] costs timed for the batch plan: {plan}", file=sys.stderr, flush=True)
        return Loaded(lm, models.tokenizer, drafter, models.method.label, plan)

    worker = DecodeWorker(load, ServerMetrics(name), name, defaults, args.max_queue,
                          limits=Limits(args.max_sequences, args.kv_tokens,
                                        ROUND_ROWS if args.round_rows is None else args.round_rows,
                                        args.request_timeout, args.shutdown_timeout, not args.no_prefix_cache))
    settings = Settings(api_key=server_key(args), max_body_bytes=args.max_body_bytes, sites=sites_of(args))
    return build(worker, settings, args.host, args.port, args.log_level), worker
