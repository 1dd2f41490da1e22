"""vLLM's speculative-decoding counters, read from its Prometheus `/metrics` text.

vLLM counts, over the server's life: drafts (rounds that proposed), draft tokens proposed,
draft tokens accepted, and accepted tokens by draft position (label `position`, 0-based). The
text format is Prometheus' exposition format; prometheus_client's parser reads it. Counters
are summed over the other labels (engine, model_name), so a server with several engines counts
once. What one request did is the difference of two reads around it (`SpecCounters.minus`),
exact only when nothing else ran meanwhile: bench reads them around a whole wave of concurrent
requests and files the difference under the wave's first row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ...errors import SpecdecError

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """What happened between `earlier` and this read."""
        positions = sorted(set(self.per_position) | set(earlier.per_position))
        return SpecCounters(
            self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens, self.accepted - earlier.accepted,
            {p: self.per_position.get(p, 0.0) - earlier.per_position.get(p, 0.0) for p in positions},
        )

    def row_fields(self) -> dict:
        """The acceptance fields of a bench row, as the summary reads them."""
        return {
            "accept_source": "vllm metrics",
            "proposed": int(self.draft_tokens),
            "accepted": int(self.accepted),
            "drafts": int(self.drafts),
            "accepted_per_position": [int(self.per_position[p]) for p in sorted(self.per_position)],
        }


def parse_counters(text: str) -> SpecCounters:
    """The spec-decode counters in a /metrics text (zeros for those absent)."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_position: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
                elif sample.name == PER_POSITION:
                    position = int(sample.labels["position"])
                    per_position[position] = per_position.get(position, 0.0) + sample.value
    except (ValueError, KeyError, TypeError) as e:
        raise SpecdecError(f"the /metrics text is not in Prometheus' format ({e})") from None
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], per_position)


def has_spec_counters(text: str) -> bool:
    """Whether a /metrics text carries vLLM's speculative-decoding counters at all."""
    try:
        return any(s.name == DRAFT_TOKENS for f in text_string_to_metric_families(text) for s in f.samples)
    except (ValueError, KeyError, TypeError):
        return False
