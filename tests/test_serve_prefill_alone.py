"""A long prompt that arrives at an idle `specdec serve` (issue 51): its prefill must not hold
the worker past what its client and the other clients need. Found by trying the faults on the
real pair (scripts/measure/serve_faults.py): a client that left 1 s into a 3000-token prompt's
prefill was counted cancelled 30 s later, when the whole prefill had run, and a request that
arrives meanwhile waits for all of it.

The tiny GGUF pair's forwards are slowed here to SLOW_S per row (NativeLM.forward_lanes, which
every forward of the native runtime goes through), so the 1500-token prompt's prefill takes
about 3 s; rounds of a few rows stay fast. The issue asks for cancellation at every stage,
prefilling alone included, and for no client to stall another: a client that leaves is seen
within one round (here < 1 s), and a short request's first token comes within a few rounds
(< 1 s), not after the long prefill.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_native import start_native, stop

SLOW_S = 0.002  # seconds per forwarded row
LONG = [20 + i % 1000 for i in range(1500)]  # token ids: about 3 s of prefill at SLOW_S
WITHIN_S = 1.0


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' server on one thread (conftest.one_thread)."""


@pytest.fixture
def served(tmp_path, monkeypatch):
    running = start_native(tmp_path)
    from specdec.runtime.native.native_lm import NativeLM

    forward = NativeLM.forward_lanes

    def slowed(blocks):
        time.sleep(SLOW_S * sum(len(tokens) for _, tokens, _ in blocks))
        return forward(blocks)

    monkeypatch.setattr(NativeLM, "forward_lanes", staticmethod(slowed))  # after the server's warm-up
    yield running
    stop(running)


def cancelled(running) -> float:
    return running.metrics().get(("specdec:requests_total", "cancelled"), 0)


def test_a_client_that_leaves_while_its_prompt_prefills_alone_is_seen_within_a_round(served):
    before = cancelled(served)
    try:
        httpx.post(f"{served.url}/v1/completions", json={"model": served.name, "prompt": LONG, "max_tokens": 8},
                   timeout=httpx.Timeout(30, read=0.3))
    except httpx.ReadTimeout:
        pass
    left = time.monotonic()
    while cancelled(served) == before and time.monotonic() - left < 30:
        time.sleep(0.02)
    took = time.monotonic() - left
    assert cancelled(served) == before + 1
    assert took < WITHIN_S, f"the request was cancelled {took:.1f} s after its client left (its whole prefill ran)"


def test_a_short_request_does_not_wait_for_a_long_prefill(served):
    body = {"model": served.name, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    long = threading.Thread(target=lambda: httpx.post(f"{served.url}/v1/completions", json={**body, "prompt": LONG},
                                                      timeout=60))
    long.start()
    time.sleep(0.3)  # the long prompt is prefilling
    sent = time.monotonic()
    with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "prompt": "a b c", "stream": True},
                      timeout=60) as reply:
        next(line for line in reply.iter_lines() if line.startswith("data: {"))
        first = time.monotonic() - sent
    long.join()
    assert first < WITHIN_S, f"the short request's first token came {first:.1f} s after it was sent"
