"""Bench rows from OpenAI-compatible endpoints (`endpoint:name=NAME` methods), beside the rows of
specdec's own methods, which another executor runs (`Routed` sends each method to its own).

A row carries what every row does (new tokens, prefill_s = time to first token, decode_s,
decode_tokens, tokens_per_s: bench.execute's definitions) and what the server says about its
speculation: llama.cpp's `timings` (draft_n, draft_n_accepted) per request, or the difference
of vLLM's /metrics counters read before and after. Where the server names no token ids the
row's `new_tokens` is None and its `text` is what equality compares.

Concurrency: `run_wave` sends one request per prompt of a wave, each on its own thread, all at
once or (arrival_gap_s) one after another at Poisson times, and times each stream on its own
and the wave as a whole (wave_s: from the wave's start to the last stream's end; wave_tokens:
all its new tokens; wave_decode_s: the time during which at least one of its requests was
decoding, the union of the requests' spans from first to last token; wave_decode_tokens: their
decode tokens; each on every row of the wave, and each row's sent_s, when its request went out
after the wave's start, and stall_s, its stream's longest wait between two chunks of tokens
after the first: what another request's prefill costs it); vLLM's counters are read around the
whole wave (they are the server's, not a request's) and filed under the wave's first row only,
so sums over rows count each wave once. A wave whose any request fails writes no row: its
rows were measured under a load the others did not see through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from ..conform.endpoints import DEFAULT_TOLERANCE, TOP_LOGPROBS, compare
from ..decode.sampling import SamplingConfig
from ..errors import SpecdecError
from ..external.endpoints.metrics import SpecCounters, parse_counters
from ..external.endpoints.spec import Endpoint, Served, get, probe
from ..external.endpoints.stream import Request, Streamed, complete, complete_openai, openai_client, sampling_fields
from ..files import write_json_atomic
from ..methods.spec import Method, parse
from .agreement import DIFFERENCES, read_differences, row_key
from .equality import same_output
from .execute import WARMUP_TOKENS
from .row import Measured
from .store import read_rows


@dataclass(frozen=True)
class EndpointSettings:
    max_new_tokens: int
    timeout_s: float
    top_logprobs: int = 1  # enough for the ids; check asks for 2, for the gap
    client: str = "httpx"  # or "openai": the official client sends the requests and reads the streams
    sampling: SamplingConfig = SamplingConfig()  # greedy by default
    seed: int | None = None  # a sampled row's seed: this plus its repeat
    arrival_gap_s: float = 0.0  # a wave's requests: 0 all at once, else arrival_offsets' mean gap


class EndpointExecutor:
    """Runs `endpoint:name=NAME` methods against the endpoints of those names."""

    def __init__(self, endpoints: list[Endpoint], settings: EndpointSettings, texts: dict[tuple[int, ...], str]):
        """`texts` maps a prompt's ids to its text, for chat endpoints (the runner hands out ids);
        `rendered` maps them to their own text (chat template applied), for a completions
        endpoint that takes no ids."""
        self.endpoints = {e.name: e for e in endpoints}
        self.settings, self.texts = settings, texts
        self.rendered: dict[tuple[int, ...], str] = {}
        self.client = httpx.Client(timeout=httpx.Timeout(settings.timeout_s))
        self.served: dict[str, Served] = {}
        self.openai: dict[str, object] = {}  # endpoint name -> its openai client (settings.client "openai")

    def prepare(self, finished: dict[str, dict | None] | None = None) -> dict[str, dict]:
        """Probe every endpoint once (a one-line error if one is down or not OpenAI-compatible);
        returns what each serves, for the run's config (the URLs go to its environment: a
        server restarted on another port may continue a run, store.VOLATILE). `finished`: the
        labels of endpoints whose rows a resumed run has, with their stored entries: one of
        those that is down keeps its entry and is asked nothing (nothing is left to measure)."""
        entries = {}
        for name, e in self.endpoints.items():
            stored = (finished or {}).get(f"endpoint:name={name}")
            try:
                self.served[name] = probe(e, self.client)
            except SpecdecError:
                if stored is None:
                    raise
                entries[name] = stored
                continue
            served = self.served[name]
            entries[name] = {"api": e.api, "model": served.model, "vllm_metrics": served.vllm_metrics,
                             "prompt_form": served.prompt_form}
            if self.settings.client != "httpx":
                entries[name]["client"] = self.settings.client
                self.openai[name] = openai_client(e, self.settings.timeout_s)
        return entries

    def urls(self) -> dict[str, str]:
        return {name: e.url for name, e in self.endpoints.items()}

    def warm_up(self, method: Method, prompt_ids: list[int]) -> None:
        self.complete(method, prompt_ids, min(WARMUP_TOKENS, self.settings.max_new_tokens))

    def run(self, method: Method, prompt_ids: list[int], repeat: int) -> Measured:
        return self.run_wave(method, [prompt_ids], repeat)[0]

    def run_wave(self, method: Method, prompts: list[list[int]], repeat: int = 0) -> list[Measured]:
        """One row per prompt, all requests in flight at once (one alone on this thread, so that
        an interrupt stops it at once rather than after the request)."""
        counters = self._counters(method)
        before = counters() if counters else None
        offsets = arrival_offsets(len(prompts), self.settings.arrival_gap_s)

        def one(i: int) -> Streamed:
            time.sleep(max(start + offsets[i] - time.perf_counter(), 0.0))
            return self.complete(method, prompts[i], self.settings.max_new_tokens, repeat=repeat)

        start = time.perf_counter()
        if len(prompts) == 1:
            streams = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
                streams = list(pool.map(one, range(len(prompts))))
        wave = {"wave_s": time.perf_counter() - start, "wave_tokens": sum(s.n_tokens for s in streams),
                **decoding_union(streams)}
        rows = [endpoint_row(s, len(prompts), self.served[method.name].prompt_form) for s in streams]
        for row, s in zip(rows, streams):
            row.served.update(wave, sent_s=s.sent - start)
        if counters:
            rows[0].served.update(counters().minus(before).row_fields())
        return rows

    def close(self) -> None:
        self.client.close()
        for client in self.openai.values():
            client.close()

    def complete(self, method: Method, prompt_ids: list[int], max_tokens: int, top_logprobs: int | None = None,
                 repeat: int = 0) -> Streamed:
        endpoint, served, key = self.endpoints[method.name], self.served[method.name], tuple(prompt_ids)
        s, seed = self.settings.sampling, self.settings.seed
        sampling = sampling_fields(s.temperature, s.top_k, s.top_p, s.min_p, None if seed is None else seed + repeat)
        request = Request(max_tokens, prompt_ids=prompt_ids, message=self.texts.get(key),
                          prompt_text=self.rendered.get(key), top_logprobs=top_logprobs or self.settings.top_logprobs,
                          sampling=sampling)
        if method.name in self.openai:
            return complete_openai(self.openai[method.name], endpoint, served.model, request, served.prompt_form)
        return complete(self.client, endpoint, served.model, request, served.prompt_form)

    def _counters(self, method: Method) -> Callable[[], SpecCounters] | None:
        endpoint = self.endpoints[method.name]
        if not self.served[method.name].vllm_metrics:
            return None
        return lambda: parse_counters(get(self.client, endpoint, f"{endpoint.server}/metrics").text)


def explain_endpoint_differences(out: Path, executor: EndpointExecutor, prompt_ids: dict[str, list[int]],
                                 baselines: dict[str, str], tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """For every endpoint row whose output differs from its baseline endpoint's (`baselines`:
    endpoint label -> baseline label), ask both servers again with two top logprobs and file the
    first difference with the baseline's gap there (endpoint_check.compare) in differences.json,
    as agreement.explain_differences does for hf-ar; greedy servers repeat themselves, and a
    difference that does not come back is filed as "not reproduced". Rows explained before are
    kept; returns the file's content."""
    path = out / DIFFERENCES
    known = read_differences(out)
    rows = read_rows(out)
    by_key = {(r["method"], r["prompt_id"], r["repeat"]): r for r in rows}
    for r in rows:
        baseline = baselines.get(r["method"])
        ref = by_key.get((baseline, r["prompt_id"], r["repeat"]))
        key = row_key(r)
        if ref is None or r["method"] == baseline or key in known or same_output(r, ref):
            continue
        method = parse(r["method"])
        if not {method.name, parse(baseline).name} <= set(executor.served):
            continue  # a finished endpoint that is down now (a resumed run): left unexplained
        ids = prompt_ids[r["prompt_id"]]
        again = [executor.complete(m, ids, executor.settings.max_new_tokens, top_logprobs=TOP_LOGPROBS)
                 for m in (parse(baseline), method)]
        diff = compare(0, *again, tolerance)
        known[key] = {"position": diff.position, "reference_token": diff.reference_token,
                      "token": diff.candidate_text, "gap": diff.gap, "tolerance": tolerance,
                      "kind": diff.kind or "not reproduced"}
    if known:
        write_json_atomic(path, known)
    return known


def arrival_offsets(n: int, mean_gap_s: float) -> list[float]:
    """When each of a wave's `n` requests goes out, in seconds after the wave's start: all at
    once (mean_gap_s 0), or one after another with exponential gaps of that mean, as requests
    from independent users arrive (a Poisson process). The gaps come from a fixed seed, so every
    method's wave sees the same arrivals and the rows stay paired."""
    if mean_gap_s <= 0 or n < 2:
        return [0.0] * n
    gaps = np.random.default_rng(0).exponential(mean_gap_s, n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def decoding_union(streams: list[Streamed]) -> dict:
    """A wave's decode time in all: how long at least one of its requests was decoding (the union
    of their spans from first to last token, in perf_counter time), and their decode tokens. A
    server that serves the wave's requests one after another gets the sum of their decode times
    (its in-all decode rate stays a single request's); one that decodes them together, about one."""
    spans = sorted((s.sent + s.ttft_s, s.sent + s.ttft_s + s.decode_s) for s in streams if s.stamps)
    total, end = 0.0, float("-inf")
    for lo, hi in spans:
        total += max(hi - max(lo, end), 0.0)
        end = max(end, hi)
    return {"wave_decode_s": total, "wave_decode_tokens": sum(s.decode_tokens for s in streams)}


def endpoint_row(s: Streamed, concurrency: int, prompt_form: str) -> Measured:
    """The measurements of one endpoint row; `prompt_form`: how its prompt was sent (the
    server's memory is not this process's to measure)."""
    timings = s.timings or {}
    drafted = "draft_n" in timings
    gaps = np.diff(s.stamps)
    served = {"text": s.text, "ttft_s": s.ttft_s, "concurrency": concurrency, "prompt_form": prompt_form,
              "stall_s": float(gaps.max()) if len(gaps) else None,
              "accept_source": "llama.cpp timings" if drafted else None, "server_timings": s.timings,
              "proposed": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}
    return Measured(s.ids, s.n_tokens, s.finish_reason, s.ttft_s, s.decode_s, s.decode_tokens,
                    {"prefill": s.ttft_s, "decode": s.decode_s}, served=served)


class Routed:
    """The runner's executor: endpoint methods to `endpoints`, the others to `local`."""

    def __init__(self, local, endpoints: EndpointExecutor | None):
        self.local, self.endpoints = local, endpoints

    def _for(self, method: Method):
        return self.endpoints if method.is_endpoint else self.local

    def warm_up(self, method: Method, prompt_ids: list[int]) -> None:
        self._for(method).warm_up(method, prompt_ids)

    def run(self, method: Method, prompt_ids: list[int], repeat: int) -> Measured:
        return self._for(method).run(method, prompt_ids, repeat)

    def run_wave(self, method: Method, prompts: list[list[int]], repeat: int = 0) -> list[Measured]:
        return self.endpoints.run_wave(method, prompts, repeat)
