"""The server's Prometheus metrics (GET /metrics), in a registry of its own.

Speculation counters mean what vLLM's `vllm:spec_decode_*` and llama-server's
`llamacpp:spec_decode_*` mean, under specdec's prefix: drafts (rounds that proposed at least one
token), draft tokens proposed, draft tokens accepted, and accepted tokens by draft position
(label `position`, 0-based: how many rounds accepted their guess at that position); plus the
verify rounds, so the mean accepted length over any interval is
(accepted + rounds) / rounds. Token counters and latency histograms follow vLLM's names.
Every request's numbers are added when it ends (answered, stopped or cancelled), so the
difference of two reads around one request is exactly that request's `timings`.

Inter-token latency: a round commits several tokens at once; the time since the previous
commit is spread evenly over the tokens of the round (one observation per token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # torch loads where the worker decodes
    from ..decode.stats import GenerationStats

PREFIX = "specdec:"
CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class ServerMetrics:
    def __init__(self, model: str):
        self.registry = r = CollectorRegistry()
        self.model = model
        labels = ["model_name"]
        self.requests = Counter(f"{PREFIX}requests", "Requests that ended, by outcome: stop (end of sequence or a "
                                "stop string), length, cancelled (client gone or server stopping), error",
                                labels + ["outcome"], registry=r)
        self.rejected = Counter(f"{PREFIX}requests_rejected", "Requests refused before decoding, by reason: "
                                "invalid (bad JSON or fields), unauthorized, forbidden (a web origin or Host "
                                "not allowed), too_large, queue_full, loading, "
                                "unavailable (load failed, or stopping)", labels + ["reason"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens prefilled", labels, registry=r)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Tokens generated (returned to clients)",
                                         labels, registry=r)
        self.drafts = Counter(f"{PREFIX}spec_decode_num_drafts", "Speculation rounds that proposed tokens", labels,
                              registry=r)
        self.draft_tokens = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Draft tokens proposed", labels,
                                    registry=r)
        self.accepted = Counter(f"{PREFIX}spec_decode_num_accepted_tokens", "Draft tokens accepted", labels,
                                registry=r)
        self.per_position = Counter(f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                    "Draft tokens accepted, by position in the draft (0-based)",
                                    labels + ["position"], registry=r)
        self.cache_queries = Counter(f"{PREFIX}prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                     "cache (vLLM's prefix_cache_queries)", labels, registry=r)
        self.cache_hits = Counter(f"{PREFIX}prefix_cache_hits", "Prompt tokens the prefix cache held, not "
                                  "forwarded again (vLLM's prefix_cache_hits)", labels, registry=r)
        self.rounds = Counter(f"{PREFIX}spec_decode_num_rounds", "Decode rounds (target verify forwards) after "
                              "the prefill", labels, registry=r)
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "From a request's arrival (queue wait "
                              "included) to its first token", labels, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds", "Time per token after the first: each "
                             "round's time spread over the tokens it committed", labels, buckets=ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "From a request's arrival to its end",
                             labels, buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(f"{PREFIX}request_queue_time_seconds", "Time a request waited in the queue",
                                    labels, buckets=E2E_BUCKETS, registry=r)
        self.running = Gauge(f"{PREFIX}num_requests_running", "Requests being decoded", labels, registry=r)
        self.waiting = Gauge(f"{PREFIX}num_requests_waiting", "Requests waiting in the queue", labels, registry=r)
        for outcome in ("stop", "length", "cancelled", "error"):  # every series shows from the start
            self.requests.labels(model, outcome)
        for counter in (self.prompt_tokens, self.generation_tokens, self.drafts, self.draft_tokens, self.accepted,
                        self.rounds, self.cache_queries, self.cache_hits):
            counter.labels(model)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model, reason).inc()

    def ended(self, outcome: str, prompt_tokens: int, generated: int, stats: GenerationStats | None) -> None:
        """A request that decoded: its outcome, token counts and the engine's record of its
        speculation (None when it failed before decoding)."""
        m = self.model
        self.requests.labels(m, outcome).inc()
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(generated)
        if stats is not None:
            self.drafts.labels(m).inc(stats.drafts)
            self.draft_tokens.labels(m).inc(stats.proposed)
            self.accepted.labels(m).inc(stats.accepted)
            self.rounds.labels(m).inc(stats.rounds)
            for position, count in enumerate(stats.position_accepted):
                self.per_position.labels(m, str(position)).inc(count)

    def prefix_cache(self, queried: int, hit: int) -> None:
        """A request's prompt tokens looked up in the prefix cache and those it held."""
        self.cache_queries.labels(self.model).inc(queried)
        self.cache_hits.labels(self.model).inc(hit)

    def text(self) -> bytes:
        return generate_latest(self.registry)
