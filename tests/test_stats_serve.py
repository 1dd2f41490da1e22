"""The server reports the engine's record of a request (decode.stats.GenerationStats): its
`timings` and the growth of /metrics over the request equal the record's numbers, on the tiny
native GGUF pair (tests/serve_native.py)."""

from __future__ import annotations

import pytest
from serve_native import start_native, stop

from specdec.serve.job import Decode


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' server on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = start_native(tmp_path_factory)
    yield running
    stop(running)


@pytest.fixture
def records(monkeypatch) -> list:
    """The records the worker finishes requests with, as it hands them to the reply."""
    seen, finish = [], Decode.finish

    def spy(self, result, *rest):
        seen.append(result.stats)
        return finish(self, result, *rest)

    monkeypatch.setattr(Decode, "finish", spy)
    return seen


def test_timings_and_metrics_are_the_records_numbers(served, records):
    before = served.metrics()
    reply = served.client().completions.create(model=served.name, prompt="a b c d e a b c", max_tokens=24,
                                               temperature=0, extra_body={"ignore_eos": True})
    after = served.metrics()
    [s] = records
    t = reply.model_extra["timings"]
    assert s.proposed > 0 and s.rounds > 1  # the request speculated: the comparison below means something
    assert (t["draft_n"], t["draft_n_accepted"], t["drafts"], t["rounds"]) == (s.proposed, s.accepted, s.drafts,
                                                                                s.rounds)
    assert (t["target_calls"], t["draft_calls"]) == (s.target_calls, s.draft_calls)
    assert t["accepted_per_position"] == s.position_accepted
    assert t["acceptance_per_position"] == pytest.approx(s.position_acceptance)
    assert t["mean_accepted_length"] == pytest.approx(s.mean_accepted_length)
    assert t["acceptance_rate"] == pytest.approx(s.acceptance_rate)
    assert t["prompt_ms"] == pytest.approx(1e3 * s.prefill_seconds)
    assert t["predicted_ms"] == pytest.approx(1e3 * s.decode_seconds)
    assert t["predicted_n"] == reply.usage.completion_tokens == s.new_tokens == 24
    assert t["predicted_per_second"] == pytest.approx(s.tokens_per_s)  # no stop string cut any token

    grew = lambda name, *labels: after.get((name, *labels), 0) - before.get((name, *labels), 0)  # noqa: E731
    assert grew("specdec:spec_decode_num_draft_tokens_total") == s.proposed
    assert grew("specdec:spec_decode_num_accepted_tokens_total") == s.accepted
    assert grew("specdec:spec_decode_num_drafts_total") == s.drafts
    assert grew("specdec:spec_decode_num_rounds_total") == s.rounds
    for position, count in enumerate(s.position_accepted):
        assert grew("specdec:spec_decode_num_accepted_tokens_per_pos_total", str(position)) == count
    assert grew("specdec:generation_tokens_total") == s.new_tokens
