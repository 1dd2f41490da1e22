"""`specdec check --endpoint NAME=URL --reference NAME=URL`: is a server's speculative greedy
output the same as another server's plain greedy output, prompt by prompt?

Both endpoints decode check.GREEDY_PROMPTS greedily. Outputs are compared by token ids where
both name them (logprobs), else token by token by text: llama.cpp sends logprobs only for the
tokens it did not speculate, but streams one token per chunk, so its speculative output's tokens
are its chunks. (Where even that is unknown, the first differing token is taken as the
reference token whose text the candidate's text leaves, which can be one token late when a
shorter reference token is a prefix of the candidate's.) At that token the reference's own
top_logprobs give the gap between its two best tokens (log-probabilities differ by exactly
what the logits do), and conformance.tie_kind says what the difference is: an exact tie or a
near-tie (below the tolerance: the speculative server's verify batch rounds otherwise than its
one-token decode), or not a tie, which fails the check, as does a difference whose gap the
reference did not give.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import httpx

from ..external.endpoints.spec import Endpoint, Served, probe
from ..external.endpoints.stream import Request, Streamed, complete
from .ties import tie_kind

# Gap (in log-probability, which is the logit gap) below which a difference between two servers
# counts as a near-tie. llama.cpp computes logits in float32, but from activations quantized to
# 8 bits per block, and its batched (verify) and one-token kernels quantize and sum in different
# orders: that moves a logit by far more than float32 rounding (conformance's 1e-3). A gap of
# 0.1 is a 10% odds ratio between the two best tokens; measured (docs/serving.md), llama.cpp's
# speculation with 8 drafted tokens flipped a choice 0.15 apart, which this check reports as
# not a tie: the speculative server's output is then not the plain server's, beyond a near-tie.
DEFAULT_TOLERANCE = 0.1
TOP_LOGPROBS = 2  # the two best tokens: their gap


@dataclass(frozen=True)
class PromptResult:
    prompt: int
    reference_tokens: int
    candidate_tokens: int
    position: int | None = None  # first differing new token, None: equal
    reference_token: str | None = None
    candidate_text: str | None = None  # the candidate's token there (or its next few characters)
    gap: float | None = None
    kind: str | None = None

    @property
    def passed(self) -> bool:
        return self.position is None or self.kind in ("exact tie", "near-tie")

    def describe(self) -> str:
        if self.position is None:
            return f"identical ({self.reference_tokens} tokens)"
        gap = "no top_logprobs from the reference" if self.gap is None else f"top-1/top-2 logprob gap {self.gap:.4g}"
        return (f"first difference at new token {self.position} ({self.reference_token!r} vs "
                f"{self.candidate_text!r}), {gap}: {self.kind}")


def probe_both(client: httpx.Client, candidate: Endpoint, reference: Endpoint) -> dict[str, Served]:
    """What each endpoint serves (spec.probe): a one-line error for one that is down, before
    any prompt is sent."""
    return {e.name: probe(e, client) for e in (candidate, reference)}


def run_check(client: httpx.Client, candidate: Endpoint, reference: Endpoint, served: dict[str, Served],
              prompts: list[tuple[list[int] | None, str, str | None]], tokens: int, tolerance: float,
              progress=lambda: None) -> list[PromptResult]:
    """Both endpoints (`served`: probe_both's answer) on every (ids, message, ids as text)
    prompt; one result each."""
    ask = lambda e, request: complete(client, e, served[e.name].model, request, served[e.name].prompt_form)
    results = []
    for i, (ids, text, rendered) in enumerate(prompts):
        request = Request(tokens, prompt_ids=ids, message=text, prompt_text=rendered, top_logprobs=TOP_LOGPROBS)
        ref, got = ask(reference, request), ask(candidate, request)
        results.append(compare(i, ref, got, tolerance))
        progress()
    return results


def compare(prompt: int, ref: Streamed, got: Streamed, tolerance: float) -> PromptResult:
    base = PromptResult(prompt, ref.n_tokens, got.n_tokens)
    position = _first_difference(ref, got)
    if position is None:
        return base
    top = ref.top[position] if position < len(ref.top) else []
    gap = top[0][1] - top[1][1] if len(top) >= 2 else None
    tokens = got.token_texts
    if tokens is not None:
        candidate = tokens[position] if position < len(tokens) else "(end)"
    else:
        start = len("".join(ref.pieces[:position]))
        candidate = got.text[start:start + 16] or "(end)"
    return PromptResult(
        prompt, ref.n_tokens, got.n_tokens, position,
        reference_token=ref.pieces[position] if position < len(ref.pieces) else "(end)",
        candidate_text=candidate, gap=gap, kind=tie_kind(gap, tolerance),
    )


def _first_by_tokens(ref: list, got: list) -> int:
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))


def _first_difference(ref: Streamed, got: Streamed) -> int | None:
    """Index of the first new token where the outputs part, None where they are equal."""
    if ref.ids is not None and got.ids is not None:
        return None if ref.ids == got.ids else _first_by_tokens(ref.ids, got.ids)
    if ref.text == got.text:
        return None
    ref_tokens, got_tokens = ref.token_texts, got.token_texts
    if ref_tokens is not None and got_tokens is not None:
        return _first_by_tokens(ref_tokens, got_tokens)
    # By text: the reference token whose text the candidate's text stops following.
    char = next((i for i, (a, b) in enumerate(zip(ref.text, got.text)) if a != b), min(len(ref.text), len(got.text)))
    end = 0
    for position, piece in enumerate(ref.pieces):
        end += len(piece)
        if end > char:
            return position
    return len(ref.pieces)


def to_json(results: list[PromptResult], candidate: Endpoint, reference: Endpoint, tolerance: float,
            seconds: float) -> dict:
    return {
        "passed": all(r.passed for r in results), "seconds": seconds, "tolerance": tolerance,
        "endpoint": asdict(candidate), "reference": asdict(reference),
        "prompts": [{**asdict(r), "passed": r.passed} for r in results],
    }
