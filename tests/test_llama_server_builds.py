"""Which cached llama.cpp build specdec's comparisons run (external.llama_server.builds/binary):
the build for this CPU (scripts/setup_llama_server.sh records the instruction sets it needs in
BUILD_INFO's `requires:`) before the x86-64-v3 one, never a build this CPU cannot run. Fake
builds in a private cache; the CPU's flags are set by the test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from specdec.errors import SpecdecError
from specdec.external import llama_server
from specdec.machine import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
AVX512 = "avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni"


def fake_build(cache: Path, key: str, requires: str | None, tools=("llama-server",), mtime: float = 0) -> Path:
    folder = cache / "llama-server" / key
    folder.mkdir(parents=True)
    info = ["llama-cpp-python 0.3.36 (vendored llama.cpp)", "-DGGML_NATIVE=OFF"]
    if requires is not None:  # builds older than the record have no requires: line
        info.append(f"requires: {requires}" if requires else "requires:")
    (folder / "BUILD_INFO").write_text("\n".join(info) + "\n")
    for tool in tools:
        (folder / tool).write_text("#!/bin/sh\n")
        os.utime(folder / tool, (mtime, mtime))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECDEC_LLAMA_SERVER", raising=False)
    return tmp_path


def on_cpu(monkeypatch, flags: str) -> None:
    monkeypatch.setattr(llama_server, "cpu_flags", lambda: set(flags.split()))


def test_the_build_for_this_cpu_comes_before_a_newer_portable_one(cache, monkeypatch):
    on_cpu(monkeypatch, f"fma avx2 {AVX512} avx512_bf16")
    wide = fake_build(cache, "0.3.36-avx512-aaa", AVX512, tools=("llama-server", "llama-bench"), mtime=1_000)
    old = fake_build(cache, "0.3.36-0123456789ab", None, mtime=2_000)  # before the requires: record
    portable = fake_build(cache, "0.3.36-portable-bbb", "", mtime=3_000)
    assert llama_server.binary() == wide / "llama-server"
    assert llama_server.builds() == [wide / "llama-server", portable / "llama-server", old / "llama-server"]
    assert llama_server.binary("llama-bench") == wide / "llama-bench"  # only that build has one


def test_a_build_needing_a_set_this_cpu_lacks_is_never_chosen(cache, monkeypatch):
    on_cpu(monkeypatch, "fma avx2 avx512f avx512cd avx512vl avx512dq avx512bw")  # no VNNI: an older Xeon
    fake_build(cache, "0.3.36-avx512-aaa", AVX512, tools=("llama-server", "llama-bench"))
    portable = fake_build(cache, "0.3.36-portable-bbb", "")
    assert llama_server.builds() == [portable / "llama-server"]
    with pytest.raises(SpecdecError, match="llama-bench is not built for this CPU: run bash scripts/setup_llama_server.sh"):
        llama_server.binary("llama-bench")


def test_no_build_says_how_to_make_one_and_the_environment_names_another(cache, monkeypatch):
    with pytest.raises(SpecdecError, match="run bash scripts/setup_llama_server.sh"):
        llama_server.binary()
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", "/opt/llama-server")
    assert llama_server.binary() == Path("/opt/llama-server")


def test_the_setup_refuses_an_unknown_argument():
    run = subprocess.run(["bash", str(ROOT / "scripts/setup_llama_server.sh"), "--native"], capture_output=True, text=True)
    assert run.returncode == 2 and "usage: bash scripts/setup_llama_server.sh [--portable]" in run.stderr


def test_the_installed_builds_run_on_this_cpu_and_the_best_has_every_avx512_set_it_names():
    """On the machine's real cache (skipped where nothing is built): what the set-up built for
    this CPU asks for no flag the CPU lacks and names every AVX-512 set llama.cpp can use here."""
    found = llama_server.builds()
    if not found:
        pytest.skip("llama-server is not built here (bash scripts/setup_llama_server.sh)")
    have = cpu_flags()
    best = llama_server._required_flags(found[0].parent)
    assert best <= have
    usable = {"avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16", "avx_vnni"} & have
    if "avx512f" in have and "-avx512-" in found[0].parent.name:
        assert usable <= best
