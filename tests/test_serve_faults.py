"""`specdec serve` under faults, on the native runtime (tests/serve_native.py's tiny GGUF pair):
a long request beside short ones (their first tokens within a few rounds), clients leaving while
queued or while their prompt is forwarded in chunks, a forward, a finish and the plan raising
once, a worker that dies, a graceful shutdown, the per-request timeout, and a client that stops
reading."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve_native import start_native, stop

PROMPT = "a b c d e a b c"
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return tmp_path_factory.mktemp("faults-gguf")


class Rounds:
    """Counts the server's rounds (decode.batch.Batch.step), each made `delay` seconds longer so
    that a request runs for a while."""

    def __init__(self, monkeypatch, delay: float = 0.01):
        from specdec.decode.batch import Batch

        self.count = 0
        step = Batch.step

        def counted(batch):
            self.count += 1
            time.sleep(delay)
            return step(batch)

        monkeypatch.setattr(Batch, "step", counted)


def body(running, tokens: int, stream: bool = False, prompt: str = PROMPT) -> dict:
    return {"model": running.name, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": stream,
            **NO_EOS}


def ask(running, tokens: int, prompt: str = PROMPT) -> httpx.Response:
    return httpx.post(f"{running.url}/v1/completions", json=body(running, tokens, prompt=prompt), timeout=60)


def wait_for(condition, seconds: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_short_requests_first_token_never_waits_for_a_long_ones_last(gguf, monkeypatch):
    """A request asking for 230 tokens fills a 256-position budget as it grows; three short
    requests sent then start within 4 rounds each (the long one is preempted: it asked for the
    most) and end long before it; the long one resumes and its text equals the same request
    answered alone."""
    running = start_native(gguf, "--kv-tokens", "256")
    try:
        alone = ask(running, 230).json()["choices"][0]["text"]
        rounds = Rounds(monkeypatch, delay=0.002)
        firsts: list[int] = []
        done: dict[str, float] = {}
        preempted: list = []
        running.worker.scheduler.on_preempt = preempted.append
        sent: list[int] = []  # the round count when each short request reached the worker
        submit = running.worker.submit
        monkeypatch.setattr(running.worker, "submit", lambda job: (
            job.generation.max_tokens == 4 and sent.append(rounds.count)) or submit(job))

        def short(i: int) -> None:
            with httpx.stream("POST", f"{running.url}/v1/completions", json=body(running, 4, True), timeout=60) as r:
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        firsts.append(rounds.count)
                        break
                for _ in lines:
                    pass
            done[f"short{i}"] = time.monotonic()

        text, threads = [], []
        grown = lambda: any(d.new >= 190 for d in running.worker.scheduler.active)  # 205 of 256 positions
        with httpx.stream("POST", f"{running.url}/v1/completions", json=body(running, 230, True), timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                text.append(json.loads(line[len("data: "):])["choices"][0]["text"])
                if not threads and grown():
                    threads = [threading.Thread(target=short, args=(i,)) for i in range(3)]
                    for t in threads:
                        t.start()
        done["long"] = time.monotonic()
        for t in threads:
            t.join()
    finally:
        stop(running)
    assert "".join(text) == alone and preempted and all(r.options.max_new_tokens == 230 for r in preempted)
    assert len(firsts) == 3 and max(firsts) - max(sent) <= 3, (firsts, sent)
    assert max(done[f"short{i}"] for i in range(3)) < done["long"]
    assert running.worker.scheduler.waiting == []


def test_clients_that_leave_while_queued_or_prefilling_free_their_place_within_a_round(gguf, monkeypatch):
    """One request decodes (at most two at a time, one more may queue); a client whose request
    waits in the queue leaves: its queue place is free at once (a new request queues instead of
    a 503); a client whose long prompt is being forwarded in chunks inside the running rounds
    leaves: it is gone from the batch within a round, its lanes freed; the running request ends
    as it would alone."""
    running = start_native(gguf, "--max-sequences", "2", "--max-queue", "1", "--round-rows", "16")
    worker = running.worker
    try:
        alone = ask(running, 300).json()["choices"][0]["text"]
        rounds = Rounds(monkeypatch)
        before = running.metrics()
        pool = ThreadPoolExecutor(4)
        long = pool.submit(lambda: ask(running, 300).json()["choices"][0]["text"])
        wait_for(lambda: len(worker.scheduler.active) == 1, what="the first request to run")
        prompt = " ".join(["a b c d e f g h"] * 60)  # ~480 tokens: 30 rounds of chunks at least
        with httpx.stream("POST", f"{running.url}/v1/completions", json=body(running, 8, True, prompt), timeout=30):
            wait_for(lambda: any(d.lm.length for d in worker.scheduler.batch.joining),
                     what="the prompt to be forwarded in chunks")
            joiner = next(iter(worker.scheduler.batch.joining))
            assert 0 < joiner.lm.length < joiner.prompt.numel()
        job = worker.scheduler.active[joiner].tag.job
        wait_for(lambda: job.cancelled, what="the server to see the client leave")
        at = rounds.count
        wait_for(lambda: not worker.scheduler.batch.joining, what="the leaving prompt to go")
        assert rounds.count - at <= 1 and joiner.lm.length == 0
        third = pool.submit(lambda: ask(running, 300))
        wait_for(lambda: len(worker.scheduler.active) == 2, what="the second request to run")
        with httpx.stream("POST", f"{running.url}/v1/completions", json=body(running, 8, True), timeout=30):
            wait_for(lambda: worker.jobs.waiting == 1 and worker.scheduler.waiting, what="a request to queue")
            with pytest.raises(openai.APIStatusError, match="requests are waiting"):
                running.client().completions.create(model=running.name, prompt=PROMPT, max_tokens=2)
        wait_for(lambda: worker.jobs.waiting == 0 and not worker.scheduler.waiting, what="its queue place")
        assert ask(running, 2).status_code == 200  # queued where the leaver was, then answered
        assert long.result() == alone and third.result().status_code == 200
        after = running.metrics()
    finally:
        stop(running)
    assert after[("specdec:requests_total", "cancelled")] - before[("specdec:requests_total", "cancelled")] == 2
    assert after[("specdec:num_requests_waiting",)] == 0


def _internal(reply: httpx.Response, secret: str) -> None:
    """A 500 that says "internal error" with an id and never the exception's text."""
    assert reply.status_code == 500, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith("internal error err-") and secret not in reply.text


@pytest.mark.parametrize("fault", ["forward", "plan", "finish"])
def test_a_fault_raised_once_fails_at_most_its_own_request_and_the_server_stays_healthy(gguf, monkeypatch, fault):
    """Three requests decode together when the round's shared forward (or the plan) raises once:
    the round runs again from the committed tokens and every request gets the text it gets
    alone; a request's finish that raises fails that request alone with a 500 that names no
    exception text; /health stays 200 and the next request is answered."""
    from specdec.decode import batch as batch_module
    from specdec.decode.plan import Planner
    from specdec.serve.job import Decode

    secret = "secret-fault-text"
    running = start_native(gguf)
    try:
        alone = [ask(running, 40 + 5 * i).json()["choices"][0]["text"] for i in range(3)]
        Rounds(monkeypatch)
        calls = []

        def once(original):
            def raising(*args, **kwargs):
                calls.append(1)
                if len(calls) == 12:
                    raise RuntimeError(secret)
                return original(*args, **kwargs)
            return raising

        if fault == "forward":
            monkeypatch.setattr(batch_module, "forward_blocks", once(batch_module.forward_blocks))
        elif fault == "plan":
            monkeypatch.setattr(Planner, "__call__", once(Planner.__call__))
        else:
            finish = Decode.finish
            monkeypatch.setattr(Decode, "finish", lambda self, *a: 1 / 0 if not calls.append(1) and len(calls) == 1
                                else finish(self, *a))
        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda i: ask(running, 40 + 5 * i), range(3)))
        assert len(calls) >= (12 if fault != "finish" else 3)
        health = httpx.get(f"{running.url}/health")
        after = ask(running, 5)
    finally:
        stop(running)
    if fault == "finish":
        failed = [r for r in replies if r.status_code != 200]
        assert len(failed) == 1
        _internal(failed[0], "division")
        assert [r.json()["choices"][0]["text"] for r in replies if r.status_code == 200] == \
            [t for t, r in zip(alone, replies) if r.status_code == 200]
    else:
        assert [r.json()["choices"][0]["text"] for r in replies] == alone
    assert health.status_code == 200 and after.status_code == 200


def test_a_worker_that_dies_answers_everyone_and_reports_itself_dead(gguf, monkeypatch):
    """A fault outside every request's own handling (the loop's sweep) kills the worker: the
    running and the queued request get a 500 at once (internal error with an id, no exception
    text), /health answers 503 with status "dead" and the reason, new requests get 503, and the
    server is told to exit (serve returns 2)."""
    from specdec.serve.rounds import Rounds as Loop

    running = start_native(gguf, "--max-sequences", "1")
    reasons = []
    exit_server, running.worker.on_death = running.worker.on_death, reasons.append  # /health read first
    try:
        Rounds(monkeypatch)
        pool = ThreadPoolExecutor(2)
        replies = [pool.submit(ask, running, 400), None]
        wait_for(lambda: running.worker.scheduler.active, what="the first request to run")
        replies[1] = pool.submit(ask, running, 400)
        wait_for(lambda: running.worker.scheduler.waiting, what="the second request to queue")
        sweep = Loop._sweep
        monkeypatch.setattr(Loop, "_sweep", lambda self: (_ for _ in ()).throw(KeyError("secret-fault-text")))
        results = [r.result(timeout=10) for r in replies]
        monkeypatch.setattr(Loop, "_sweep", sweep)
        health = httpx.get(f"{running.url}/health")
        refused = ask(running, 2)
        exit_server(*reasons)
        exiting = running.server.should_exit
    finally:
        stop(running)
    for reply in results:
        _internal(reply, "secret-fault-text")
    assert health.status_code == 503 and health.json()["status"] == "dead"
    assert "decode worker" in health.json()["error"]["message"] and "err-" in health.json()["error"]["message"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "worker_dead"
    assert exiting and running.worker.state == "dead"


def test_sigterm_lets_running_requests_finish_and_refuses_new_ones(gguf, monkeypatch):
    """What SIGTERM does by default: the stream in progress runs to its end (finish_reason
    "length", every token), a request sent meanwhile gets 503 and /health 503 "stopping", and
    the worker stops once the stream ended."""
    running = start_native(gguf)
    Rounds(monkeypatch)
    lines, meanwhile = [], []
    with httpx.stream("POST", f"{running.url}/v1/completions", json=body(running, 120, True), timeout=30) as reply:
        for line in filter(None, reply.iter_lines()):
            lines.append(line)
            if len(lines) == 1:
                running.worker.stop()  # what Server.handle_exit does first on SIGTERM
                meanwhile += [ask(running, 2), httpx.get(f"{running.url}/health")]
    running.worker.join(10)
    stop(running)
    last = json.loads(lines[-2][len("data: "):])
    assert lines[-1] == "data: [DONE]" and last["choices"][0]["finish_reason"] == "length"
    assert last["timings"]["predicted_n"] == 120
    assert [r.status_code for r in meanwhile] == [503, 503] and meanwhile[1].json()["status"] == "stopping"
    assert running.worker.state == "stopped"


def test_the_request_timeout_ends_a_running_request_with_abort_and_refuses_a_waiting_one(gguf, monkeypatch):
    """--request-timeout 0.5: a long request ends after about 0.5 s with finish_reason "abort"
    and the tokens it made; one that waited that long in the queue gets 503 (code timeout). (A
    round takes 0.3 s here, longer than between the two arrivals, so both are late at the same
    check.)"""
    running = start_native(gguf, "--request-timeout", "0.5", "--max-sequences", "1")
    try:
        Rounds(monkeypatch, delay=0.3)
        with ThreadPoolExecutor(2) as pool:
            start = time.monotonic()
            first = pool.submit(ask, running, 1000)
            wait_for(lambda: running.worker.scheduler.active, what="the first request to run")
            queued = pool.submit(ask, running, 1000).result()
            late = first.result()
            took = time.monotonic() - start
    finally:
        stop(running)
    assert late.status_code == 200 and late.json()["choices"][0]["finish_reason"] == "abort"
    assert 0 < late.json()["usage"]["completion_tokens"] < 1000 and took < 3
    assert queued.status_code == 503 and queued.json()["error"]["code"] == "timeout"


def test_a_client_that_stops_reading_holds_no_one(gguf, monkeypatch):
    """A streamed request whose client never reads a byte: the worker never waits for it (its
    events wait in its own queue), so requests sent after it are answered at once, and it runs
    to its end."""
    running = start_native(gguf)
    try:
        Rounds(monkeypatch, delay=0.002)
        host, port = running.url.removeprefix("http://").split(":")
        payload = json.dumps(body(running, 1000, True)).encode()
        stalled = socket.create_connection((host, int(port)))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        wait_for(lambda: running.worker.scheduler.active, what="the stalled request to run")
        start = time.monotonic()
        answered = [ask(running, 5).status_code for _ in range(3)]
        took = time.monotonic() - start
        wait_for(lambda: not running.worker.scheduler.active, seconds=30, what="the stalled request to end")
        stalled.close()
    finally:
        stop(running)
    assert answered == [200, 200, 200] and took < 5
