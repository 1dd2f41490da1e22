"""`specdec serve` as users run it: a subprocess on 127.0.0.1 serving the tiny GGUF pair on
specdec's native runtime (tests/serve_native.py) with the API key from the environment, answered
by the official openai client, stopped by SIGTERM with exit status 0; the command's module loads no
HTTP stack before it runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from pathlib import Path

import httpx
import openai
import pytest
from serve_native import native_args

from specdec.files import cache_root

PROMPT = "a b c d e a b c"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_cache(folder: Path) -> dict:
    """The environment of a subprocess whose specdec cache is `folder` (the tiny files' prepared
    parts go there, not to the user's cache), the compiled kernels shared with this process's."""
    (folder / "cache").mkdir(parents=True, exist_ok=True)
    kernels = folder / "cache" / "kernels"
    if not kernels.exists():
        kernels.symlink_to(cache_root() / "kernels", target_is_directory=True)
    return {**os.environ, "SPECDEC_CACHE": str(folder / "cache")}


def test_serve_subprocess_key_from_env_and_sigterm(tmp_path):
    port = free_port()
    env = {**private_cache(tmp_path), "SPECDEC_API_KEY": "from-env"}
    command = [sys.executable, "-m", "specdec.cli", "serve", *native_args(tmp_path), "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                health = httpx.get(f"{url}/health")
                if health.status_code == 200:
                    break
                assert health.status_code == 503 and health.json()["status"] == "loading"
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "no answer from specdec serve"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="from-env", max_retries=0)
        reply = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=6,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 6 and reply.model_extra["timings"]["predicted_n"] == 6
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert process.returncode == 0, out
    assert "Finished server process" in out
    # the plan's costs: timed at start, and after serving how far the forwards it ran moved them
    assert "costs timed for the batch plan: verify over 1/2/3" in out
    assert "costs while serving, over those timed at start: draft over 1 rows x" in out, out[-600:]


def test_a_model_that_does_not_load_ends_the_server(tmp_path):
    command = [sys.executable, "-m", "specdec.cli", "serve", *native_args(tmp_path), "--target",
               str(tmp_path / "none.gguf"), "--port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=private_cache(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "specdec: error: the model did not load" in done.stderr


def test_warning_beyond_loopback_without_a_key():
    from specdec.cli.serve import host_warning

    assert host_warning("127.0.0.1", None) is None and host_warning("localhost", None) is None
    assert host_warning("::1", None) is None and host_warning("0.0.0.0", "key") is None
    assert "without an API key" in host_warning("0.0.0.0", None)
    assert "without an API key" in host_warning("192.168.1.5", None)


def test_round_rows_option(tmp_path):
    """--round-rows N fills rounds to N rows (unset: serve.worker.ROUND_ROWS; 0: no chunked
    prefill), and a negative N is refused before any model loads."""
    import argparse

    from specdec.cli.serve import build_server, register
    from specdec.errors import SpecdecError
    from specdec.serve.worker import ROUND_ROWS

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    limits = [build_server(parser.parse_args(["serve", *native_args(tmp_path), *extra]))[1].limits.round_rows
              for extra in ([], ["--round-rows", "16"], ["--round-rows", "0"])]
    assert limits == [ROUND_ROWS, 16, 0]
    with pytest.raises(SpecdecError, match="--round-rows must be >= 0"):
        build_server(parser.parse_args(["serve", "--round-rows", "-1"]))


def test_command_module_is_light():
    code = ("import sys, specdec.cli.serve; "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'specdec.serve.app') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_advise_exports_a_specdec_serve_command(capsys):
    import json
    import shlex
    from pathlib import Path

    from specdec.cli import build_parser, main

    advice = Path(ROOT) / "docs" / "advise" / "humaneval-int8.json"
    assert main(["advise", "--export", "specdec", "--from", str(advice), "--json", "--target", "t", "--draft", "d"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["command"] == "specdec serve --target t --draft d --proposer draft:k=2:quant=int8"
    assert printed["notes"] == [] and "specdec serve" in printed["confirm"]
    args = build_parser().parse_args(shlex.split(printed["command"])[1:])  # a command line serve takes
    assert args.proposer == "draft:k=2:quant=int8"
