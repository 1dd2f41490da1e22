"""bench --endpoint, check --endpoint and advise --export against real llama.cpp servers
(llama-server, built by scripts/setup_llama_server.sh) over the registry's SmolLM2-135M GGUF,
started here on free loopback ports with and without draft-model speculation and stopped after.

The speculative server drafts with the same GGUF: llama.cpp's one-token draft and its batched
verify round differently, so it rejects now and then (measured: 1 of 950 drafted tokens on
HumanEval/0-9) and its output can part from the plain server's (HumanEval/0 at 128 tokens)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import httpx
import pytest
from test_endpoints import ADVICE

from specdec.bench.store import read_rows
from specdec.cli import main
from specdec.external.llama_server import LlamaServer
from specdec.external.server_process import ServerProcess, free_port
from specdec.models.load import load_tokenizer
from specdec.registry import gguf_file
from specdec.tune.advice import Advice, Choice
from specdec.tune.export import export

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def gguf():
    return gguf_file(MODEL)


@pytest.fixture(scope="module")
def servers(gguf, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    with LlamaServer(gguf, log=logs / "plain.log") as plain, \
            LlamaServer(gguf, draft=gguf, log=logs / "spec.log") as spec:
        yield {"plain": f"plain={plain.url}/v1/completions", "spec": f"spec={spec.url}/v1/completions",
               "plain_chat": f"plain={plain.url}/v1/chat/completions"}


def test_bench_measures_llama_servers_beside_specdecs_own_method(servers, tmp_path):
    out = tmp_path / "run"
    assert main(["bench", "--dataset", "humaneval", "--limit", "3", "--max-new-tokens", "48", "--target", MODEL,
                 "--methods", "ar", "--endpoint", servers["plain"], "--endpoint", servers["spec"],
                 "--baseline", "plain", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows(out)
    assert [r["method"] for r in rows[:3]] == ["ar", "endpoint:name=plain", "endpoint:name=spec"] and len(rows) == 9
    tokenizer = load_tokenizer(MODEL)
    by = {(r["method"], r["prompt_id"]): r for r in rows}
    for r in rows:
        assert r["n_new"] >= 1 and r["prefill_s"] > 0 and r["tokens_per_s"] > 0
        if r["method"] == "endpoint:name=plain":  # every token's id came with its logprobs
            assert len(r["new_tokens"]) == r["n_new"] and tokenizer.decode(r["new_tokens"]) == r["text"]
        if r["method"] == "endpoint:name=spec":  # llama.cpp names no ids for tokens it speculated
            assert r["new_tokens"] is None and r["accept_source"] == "llama.cpp timings"
            assert 0 < r["accepted"] <= r["proposed"] == r["server_timings"]["draft_n"]
    summary = json.loads((out / "summary.json").read_text())["overall"]["methods"]
    spec = summary["endpoint:name=spec"]
    assert spec["speedup"]["n"] == 3 and summary["endpoint:name=plain"]["speedup"] is None
    assert summary["ar"]["speedup"] is None  # specdec's methods keep ar as their baseline
    differing = set(spec["greedy_equal"]["mismatching_prompts"])
    for d in spec["greedy_equal"].get("differences", []):  # each asked again, with the plain server's gap
        assert d["kind"] == "not reproduced" or (d["gap"] >= 0 and d["position"] >= 0)
    for prompt in ("HumanEval/0", "HumanEval/1", "HumanEval/2"):
        same = by[("endpoint:name=spec", prompt)]["text"] == by[("endpoint:name=plain", prompt)]["text"]
        assert same == (prompt not in differing)
    served = [r for r in rows if r["method"] == "endpoint:name=spec"]  # the server's counts (ar's are its record's)
    rate = sum(r["accepted"] for r in served) / sum(r["proposed"] for r in served)
    assert spec["acceptance_rate"] == pytest.approx(rate)
    report = (out / "report.md").read_text()
    assert "| `ar` |" in report and "| `endpoint:name=spec` |" in report


def test_check_passes_or_explains_each_difference_by_its_gap(servers, capsys):
    code = main(["check", "--endpoint", servers["spec"], "--reference", servers["plain"], "--target", MODEL,
                 "--tokens", "64", "--prompts", "6", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == (0 if result["passed"] else 1) and len(result["prompts"]) == 6
    for p in result["prompts"]:
        if p["position"] is None:
            assert p["passed"] and p["candidate_tokens"] == p["reference_tokens"]
        else:  # the gap is the plain server's own top-1/top-2 logprob gap there
            assert p["gap"] >= 0 and p["kind"] == ("near-tie" if p["gap"] < result["tolerance"] else "not a tie")


def test_check_fails_on_a_real_difference_between_two_models(servers, capsys):
    """A different model (Qwen2.5-Coder-0.5B) against SmolLM2, both through the chat API (each
    server applies its own template): their outputs part early, and not at ties."""
    with LlamaServer(gguf_file("qwen2.5-coder-0.5b-instruct")) as other:
        code = main(["check", "--endpoint", f"other={other.url}/v1/chat/completions", "--reference",
                     servers["plain_chat"], "--tokens", "16", "--prompts", "3", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and not result["passed"]
    assert any(p["kind"] == "not a tie" and p["gap"] >= result["tolerance"] for p in result["prompts"])


@pytest.mark.parametrize("method", ["draft:k=3", "lookup:k=4:ngram=2"])
def test_exported_llamacpp_flags_start_a_server_that_speculates(gguf, method):
    advice = replace(Advice.load(ADVICE), choice=Choice(method, 1.3))
    flags = export(advice, "llamacpp", str(gguf), str(gguf)).settings
    with LlamaServer(gguf, args=flags) as server:
        reply = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
            "prompt": "Count: 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3,", "max_tokens": 24,
            "temperature": 0}).json()
    timings = reply["timings"]
    assert timings["predicted_n"] == 24
    assert timings.get("draft_n", 0) > 0  # both kinds drafted: the model and the repeating n-grams


def test_concurrent_streams_on_a_server_with_two_slots(gguf, servers, tmp_path):
    """Two slots serve a wave of two at once; the one-slot plain server queues the second request."""
    with LlamaServer(gguf, parallel=2, context=8192) as two:
        assert main(["bench", "--dataset", "humaneval", "--limit", "4", "--max-new-tokens", "24", "--target", MODEL,
                     "--endpoint", f"two={two.url}", "--endpoint", servers["plain"], "--baseline", "plain",
                     "--concurrency", "2", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 8 and all(r["concurrency"] == 2 for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]
    assert summary["endpoint:name=two"]["greedy_equal"]["prompts_compared"] == 4


def test_llama_cpp_pythons_server_takes_no_token_ids_and_gets_the_prompts_text(gguf, servers, tmp_path):
    """llama-cpp-python's server refuses a prompt of token ids (its request type takes strings
    only): the probe finds it, its rows say `prompt_form: text`, and they still decode."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_threads", "2", "--n_ctx", "2048"]
    server = ServerProcess("llama_cpp.server", command, "/v1/models", 120, log=tmp_path / "py.log")
    server.start(f"http://127.0.0.1:{port}")
    try:
        refused = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": [1, 2], "max_tokens": 1},
                             timeout=30)  # what the probe meets
        assert refused.status_code != 200 and "valid string" in refused.text
        assert main(["bench", "--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "24", "--target", MODEL,
                     "--endpoint", servers["plain"], "--endpoint", f"py=http://127.0.0.1:{port}/v1/completions",
                     "--baseline", "plain", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    finally:
        server.stop()
    rows = read_rows(tmp_path / "run")
    forms = {(r["method"], r["prompt_form"]) for r in rows}
    assert forms == {("endpoint:name=plain", "ids"), ("endpoint:name=py", "text")}
    assert all(r["n_new"] >= 1 and r["tokens_per_s"] > 0 for r in rows)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["endpoints"]["py"]["prompt_form"] == "text"
    assert "endpoint **py**: model" in (tmp_path / "run" / "report.md").read_text()
