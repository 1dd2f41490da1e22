"""The model cache's conversion of a GGUF file (runtime.native.loader.store_gguf), written a layer
at a time (stored_weights.save_layers) so a cold start never holds the whole packed model.

What must hold:
- the streamed file holds the same tensors, bytes, order and layout as the whole model read at
  once and written in one go (save_weights), in int4 and int3, tied and untied heads; safetensors'
  own reader reads it;
- a conversion that fails part way leaves no weights file, no data file and no folder behind;
- (real) converting the default pair (1.5B target int4, 0.5B draft int3) from a fresh cache peaks
  under 2.5 GB resident in a process of its own (it peaked near 4.5 GB holding every packed layer;
  the issue's goal is a whole cold run under 3 GB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from gguf_files import T, write_model

from specdec.errors import SpecdecError
from specdec.files import COMPLETE_MARKER, TMP_PREFIX, WEIGHTS
from specdec.gguf import prepared
from specdec.runtime.native import loader
from specdec.runtime.native.decoder_weights import build
from specdec.runtime.native.stored_weights import save_layers, save_weights
from specdec.runtime.native.weight_source import HEAD, read_gguf


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    from specdec.gguf import store

    monkeypatch.setattr(store, "cache_root", lambda: tmp_path / "cache")


def _parts(path) -> tuple[dict, dict, bytes]:
    """A safetensors file's tensor entries (in file order), its layout and its data bytes."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    layout = json.loads(header.pop("__metadata__")["layout"])
    return header, layout, raw[8 + size :]


@pytest.mark.parametrize(("kind", "tied", "mode"), [(T.Q6_K, False, "int4"), (T.Q5_K, True, "int4"),
                                                    (T.Q4_0, False, "int3"), (T.Q8_0, True, "int3")])
def test_the_streamed_file_is_the_whole_model_written_at_once(kind, tied, mode, tmp_path):
    from safetensors import safe_open

    path = write_model(tmp_path / "m.gguf", "qwen2", kind, tied=tied)
    streamed, model = loader.store_gguf(str(path), mode)
    source = read_gguf(path, model.config, mode)
    whole = tmp_path / "whole.safetensors"
    save_weights(build(model.config, source, mode), source.linears[HEAD], whole)
    (entries, layout, data), (entries_whole, layout_whole, data_whole) = _parts(streamed), _parts(whole)
    assert list(entries.items()) == list(entries_whole.items())
    assert layout == layout_whole and data == data_whole
    assert len(layout["layers"]) == model.config.layers \
        and any(name.startswith("head_source.") for name in entries) != (tied and mode == "int4")
    with safe_open(str(streamed), "pt") as f:
        for name in ("layers.1.qkv.0.codes", "final_norm", "head.0.codes"):
            assert f.get_tensor(name).numel() > 0
    assert sorted(p.name for p in streamed.parent.iterdir()) == sorted([COMPLETE_MARKER, WEIGHTS])


def test_a_conversion_failing_part_way_leaves_nothing_behind(tmp_path, monkeypatch):
    path = write_model(tmp_path / "m.gguf", "qwen2", T.Q8_0)
    made = []

    def failing(part, i):
        if i == 1:
            raise SpecdecError("stop at layer 1")
        made.append(i)
        return real(part, i)

    real = loader.layer_weights
    monkeypatch.setattr(loader, "layer_weights", failing)
    with pytest.raises(SpecdecError, match="stop at layer 1"):
        loader.store_gguf(str(path), "int4")
    assert made == [0]
    folder, _ = prepared(path)
    left = [p.relative_to(folder) for p in folder.rglob("*") if not p.name.startswith(".lock-")]
    assert not [p for p in left if "native" in str(p) or p.suffix in (".safetensors", ".data")], left
    assert not list(folder.glob(f"{TMP_PREFIX}*"))


def test_the_writer_removes_its_files_when_the_outside_fails(tmp_path):
    def outside():
        raise RuntimeError("no head")

    target = tmp_path / "w.safetensors"
    with pytest.raises(RuntimeError, match="no head"):
        save_layers(iter([]), outside, target)
    assert list(tmp_path.iterdir()) == []


# The peak is the process's own VmHWM (kB), not getrusage's ru_maxrss: Linux carries ru_maxrss
# across exec, so a child forked from a pytest process that holds the real models (5.3 GB in the
# suite's `real` run) reported that process's size, not its own.
_PEAK = """
import re, sys
from specdec.runtime.native.loader import store_gguf
store_gguf(sys.argv[1], "int3")
store_gguf(sys.argv[2], "int4")
print(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
"""


@pytest.mark.real
def test_the_default_pairs_conversion_peaks_under_2_5_gb(tmp_path):
    """Both files converted in a fresh cache, in a process of its own (about a minute on 2 cores)."""
    from specdec.registry import gguf_file

    files = [str(gguf_file(name)) for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")]
    env = {**os.environ, "SPECDEC_CACHE": str(tmp_path / "fresh")}
    done = subprocess.run([sys.executable, "-c", _PEAK, *files], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_kib = int(done.stdout.split()[-1])
    assert peak_kib < 2.5 * 2**20, f"peak {peak_kib / 2**20:.2f} GiB"
