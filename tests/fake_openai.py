"""A small OpenAI-compatible HTTP server for the endpoint tests, on 127.0.0.1: it streams a
deterministic greedy "completion" (the prompt's ids, reversed, cycled to max_tokens) in vLLM's
layouts, keeps vLLM's speculative-decoding counters for /metrics, and misbehaves on request
(`mode`), so that every failure the bench must survive can be produced on purpose.

Counters: each completion of n tokens adds n // 2 drafts of 3 tokens, of which the first is
accepted in every draft and the second in every other one, so the expected differences are known
exactly (`expected_counters`).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

K = 3


def completion_ids(prompt: list[int], max_tokens: int) -> list[int]:
    source = list(reversed(prompt)) or [0]
    return [source[i % len(source)] for i in range(max_tokens)]


def expected_counters(n_tokens: int) -> dict:
    drafts = n_tokens // 2
    return {"drafts": drafts, "draft_tokens": K * drafts, "accepted": drafts + drafts // 2,
            "per_position": [drafts, drafts // 2, 0]}


class FakeServer:
    """`mode`: "ok", "html" (a web page, not an API), "error" (an error event mid-stream), "drop"
    (the connection closes mid-stream), "hang" (silent for `hang_s`); `fail_after`: that many
    completions succeed before the mode applies ("ok" until then)."""

    def __init__(self, mode: str = "ok", fail_after: int = 0, hang_s: float = 5.0, vllm_metrics: bool = True,
                 port: int = 0, part_at: int | None = None, takes_ids: bool = True, takes_text: bool = True,
                 stall_at: int | None = None):
        """`part_at`: from that new token on, every token is one higher (another server's output);
        `stall_at`: the stream is silent for `hang_s` before that new token (as if another
        request's prefill ran);
        `takes_ids` False: a prompt of token ids is refused (HTTP 500 with a validation error, as
        llama-cpp-python's server does); `takes_text` False: the same for a prompt of text."""
        self.mode, self.fail_after, self.hang_s, self.vllm_metrics = mode, fail_after, hang_s, vllm_metrics
        self.takes_ids, self.takes_text = takes_ids, takes_text
        self.prompts: list = []  # each streamed completion's prompt, as received
        self.bodies: list[dict] = []  # ... and its whole request body
        self.part_at, self.stall_at = part_at, stall_at
        self.completions = 0
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0, 0, 0]}
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client that hung up is the point here
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def current_mode(self) -> str:
        with self.lock:
            self.completions += 1
            return "ok" if self.completions <= self.fail_after else self.mode

    def count(self, n_tokens: int) -> None:
        with self.lock:
            add = expected_counters(n_tokens)
            for key in ("drafts", "draft_tokens", "accepted"):
                self.counters[key] += add[key]
            self.counters["per_position"] = [a + b for a, b in zip(self.counters["per_position"], add["per_position"])]

    def metrics_text(self) -> str:
        c = self.counters
        lines = []
        for name, value in (("num_drafts", c["drafts"]), ("num_draft_tokens", c["draft_tokens"]),
                            ("num_accepted_tokens", c["accepted"])):
            lines += [f"# HELP vllm:spec_decode_{name} Speculative decoding: {name.replace('_', ' ')}.",
                      f"# TYPE vllm:spec_decode_{name} counter",
                      f'vllm:spec_decode_{name}_total{{engine="0",model_name="fake"}} {float(value)}']
        lines += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens by draft position.",
                  "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="fake",position="{p}"}} '
                  f"{float(v)}" for p, v in enumerate(c["per_position"])]
        return "\n".join(lines) + "\n"


def _handler(server: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if server.mode == "html":
                return self._send(200, "text/html", b"<html><body>It works!</body></html>")
            if self.path == "/v1/models":
                return self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode())
            if self.path == "/metrics" and server.vllm_metrics:
                return self._send(200, "text/plain; version=0.0.4", server.metrics_text().encode())
            self._send(404, "application/json", b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            refused = {list: not server.takes_ids, str: not server.takes_text}.get(type(body.get("prompt")), False)
            if refused:
                return self._send(500, "application/json", b'{"error": {"message": "Input should be a valid string"}}')
            if not body.get("stream"):  # the probe's one-token request: answered, not counted
                return self._send(200, "application/json", json.dumps({"choices": [{"text": "x"}]}).encode())
            mode = server.current_mode()
            if mode == "html":
                return self._send(200, "text/html", b"<html>no API here</html>")
            if mode == "hang":
                time.sleep(server.hang_s)
            chat = self.path == "/v1/chat/completions"
            prompt = body["messages"][0]["content"] if chat else body["prompt"]
            server.prompts.append(prompt)
            server.bodies.append(body)
            prompt = [ord(c) for c in prompt[:8]] if isinstance(prompt, str) else prompt
            ids = completion_ids(prompt, body["max_tokens"])
            if server.part_at is not None:
                ids = ids[: server.part_at] + [t + 1 for t in ids[server.part_at:]]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i, token in enumerate(ids):
                if mode in ("error", "drop") and i == 2:
                    if mode == "error":
                        self._event({"error": {"message": "out of memory (simulated)", "code": 500}})
                    self.wfile.flush()
                    return
                if i == server.stall_at:
                    time.sleep(server.hang_s)
                self._event(_chunk(token, chat, body, finish=None))
                time.sleep(0.001)
            self._event(_chunk(None, chat, body, finish="length"))
            self._event({"choices": [], "usage": {"completion_tokens": len(ids)}})
            server.count(len(ids))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, payload: dict) -> None:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())

        def _send(self, code: int, kind: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _chunk(token: int | None, chat: bool, body: dict, finish: str | None) -> dict:
    """One chunk in vLLM's layout: completions' parallel lists, chat's content entries, token ids
    spelled token_id:N (return_tokens_as_token_ids); the runner-up is token + 1, 0.5 below."""
    if token is None:
        choice = {"index": 0, "finish_reason": finish, **({"delta": {}} if chat else {"text": ""})}
        return {"choices": [choice]}
    name, other = f"token_id:{token}", f"token_id:{token + 1}"
    if chat:
        logprobs = {"content": [{"token": name, "logprob": -0.1,
                                 "top_logprobs": [{"token": name, "logprob": -0.1}, {"token": other, "logprob": -0.6}]}]}
        choice = {"index": 0, "delta": {"content": f"w{token} "}, "logprobs": logprobs, "finish_reason": None}
    else:
        logprobs = {"tokens": [name], "token_logprobs": [-0.1], "top_logprobs": [{name: -0.1, other: -0.6}]}
        choice = {"index": 0, "text": f"w{token} ", "logprobs": logprobs, "finish_reason": None}
    return {"choices": [choice]}
