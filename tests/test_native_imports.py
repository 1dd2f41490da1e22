"""The native runtime's path, from GGUF files on the command line to generated tokens, imports none
of transformers' model classes (importing them took 2.8 s of a 5.4-6.2 s warm start on a 2-core
Xeon, issue 50): transformers is read only for the tokenizer. Checked in a fresh interpreter, on a
pair of small GGUF files (tests/gguf_files.py), with a restricted draft head (models.draft_head,
whose import once pulled them in)."""

from __future__ import annotations

import json
import subprocess
import sys

from gguf_files import T, write_model

CHILD = """
import json, sys
from pathlib import Path
from specdec.gguf import store
store.cache_root = lambda: Path(sys.argv[1])  # the files' parts in the test's folder
from specdec.cli import main
code = main(["generate", "--target", sys.argv[2], "--draft", sys.argv[3], "--prompt", "hi", "--raw",
             "--max-new-tokens", "4", "--json", "--proposer", "draft:k=2:quant=int4:vocab=512"])
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.startswith("transformers"))}))
"""


def _generate(folder, target, draft) -> tuple[dict, list[str]]:
    """Generate in a fresh interpreter: the output and the transformers modules it imported."""
    run = subprocess.run([sys.executable, "-c", CHILD, str(folder / "cache"), str(target), str(draft)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    generated, seen = json.loads(lines[-2]), json.loads(lines[-1])
    assert seen["code"] == 0 and len(generated["new_tokens"]) == 4, (generated, run.stderr[-2000:])
    assert run.stderr.count("on the native runtime (int4") == 2, run.stderr[-2000:]  # target and draft
    assert "transformers" in seen["modules"]  # the tokenizer's: the checks would pass vacuously without it
    return generated, seen["modules"]


def _model_classes(modules: list[str]) -> list[str]:
    """The modules that define model classes (auto's modeling_auto holds only their names)."""
    return [m for m in modules if m in ("transformers.modeling_utils", "transformers.generation.utils")
            or (m.startswith("transformers.models.") and ".modeling_" in m and ".auto." not in m)]


def test_generating_from_gguf_files_on_the_native_runtime_imports_no_transformers_model_class(tmp_path):
    """The first run reads each file's tokenizer with transformers' GGUF converter (its tokenizer
    classes, once per file); a warm run imports nothing under transformers.models."""
    target = write_model(tmp_path / "target.gguf", "qwen2", T.Q8_0, seed=0)
    draft = write_model(tmp_path / "draft.gguf", "qwen2", T.Q8_0, seed=1)
    cold, cold_modules = _generate(tmp_path, target, draft)
    assert not _model_classes(cold_modules), f"a cold run imported model classes: {_model_classes(cold_modules)}"
    warm, warm_modules = _generate(tmp_path, target, draft)
    assert warm["new_tokens"] == cold["new_tokens"]
    under_models = [m for m in warm_modules if m.startswith("transformers.models")]
    assert not under_models and not _model_classes(warm_modules), f"a warm run imported {under_models[:10]}"
