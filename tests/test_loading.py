"""The loading layer (specdec.load): a LoadSpec of small GGUF files (tests/gguf_files.py) loads and
generates, its choices recorded with why; a bad spec is one line before any weight loads; nothing
below the command line reads an argparse Namespace."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
from gguf_files import T, write_model

import specdec
from specdec.decode.engine import generate
from specdec.errors import SpecdecError
from specdec.load import LoadSpec, choose, load
from specdec.methods.spec import parse

SOURCE = Path(specdec.__file__).parent
PROMPT = [5, 9, 13, 5, 9, 13, 21, 34, 5, 9]


@pytest.fixture
def pair(tmp_path) -> LoadSpec:
    """A qwen3 target and a one-layer draft of the same draws (they agree often), as GGUF files."""
    target = write_model(tmp_path / "t.gguf", "qwen3", T.Q8_0, seed=1)
    draft = write_model(tmp_path / "d.gguf", "qwen3", T.Q4_0, seed=1, layers=1)
    return LoadSpec(str(target), str(draft), parse("draft:k=3"))


def test_a_spec_of_gguf_files_loads_and_generates_what_plain_decoding_does(pair):
    said: list[str] = []
    loaded = load(pair, say=said.append)
    choices = loaded.choices
    assert (choices.form.quant, choices.runtime, loaded.method.label) == ("int4", "native", "draft:k=3")
    assert choices.why == "as --proposer says" and choices.auto_line is None
    assert said == [choices.form.line(pair.target)] and "runs as it is" in said[0]
    assert choices.record() == {"target": "int4-g32", "group": 32, "target_reason": choices.form.reason,
                                "runtime": "native"}
    speculative = generate(loaded.lm(), PROMPT, drafter=loaded.proposer, max_new_tokens=24, eos_token_id=[])
    plain = load(replace(pair, method=parse("ar")), say=said.append)
    assert plain.proposer is None
    reference = generate(plain.lm(), PROMPT, max_new_tokens=24, eos_token_id=[])
    assert speculative.new_tokens == reference.new_tokens and len(reference.new_tokens) == 24
    assert speculative.stats.proposed > 0 and speculative.stats.draft_calls > 0


def test_auto_is_resolved_once_with_its_reason(pair):
    """`auto` without saved advice: the device default (or the hybrid where int3 does not run),
    said after the target's line, and recorded as generate --json reports it."""
    said: list[str] = []
    loaded = load(replace(pair, method=parse("auto")), say=said.append)
    resolved = loaded.method
    assert resolved.kind != "auto" and loaded.choices.auto_line.startswith(resolved.label)
    assert loaded.choices.why == f"auto: {loaded.choices.auto_line}" and "no advice measured" in loaded.choices.why
    assert said == [loaded.choices.form.line(pair.target), f"[specdec] auto: {loaded.choices.auto_line}"]
    assert choose(replace(pair, method=parse("auto"))).method == resolved  # the same choice, decided the same way


@pytest.mark.parametrize("fields, message", [
    ({"target_quant": "int4", "quant_group": 48}, "the int4 group size must be one of"),
    ({"target_quant": "int8", "device": "cuda"}, "int8 weights run on torch's CPU kernels"),
    ({"method": parse("draft:quant=int3"), "runtime": "hf", "target_quant": "none"},
     "int3 weights run on specdec's native runtime only"),
    ({"method": parse("hf-assisted:k=2")}, "has no specdec proposer"),
    ({"target": "no/such-model", "runtime": "hf"}, "unknown model 'no/such-model'"),
    ({"runtime": "native", "target_quant": "none"}, "--runtime native: it runs int4 or int8 weights"),
])
def test_a_bad_spec_is_one_line_before_any_weight_loads(pair, monkeypatch, fields, message):
    def refuse(*_args, **_kwargs):
        raise AssertionError("weights were loaded before the spec was checked")

    for where in ("specdec.load.loaded.load_target", "specdec.load.loaded.load_drafts",
                  "specdec.load.loaded.store_draft", "specdec.models.load.load_model"):
        monkeypatch.setattr(where, refuse)
    said: list[str] = []
    with pytest.raises(SpecdecError, match=message) as error:
        load(replace(pair, **fields), say=said.append)
    assert "\n" not in str(error.value) and said == []


@pytest.mark.parametrize("fields, message", [({"runtime": "fast"}, "unknown runtime 'fast'"),
                                             ({"dtype": "int8"}, "unknown dtype 'int8'"),
                                             ({"target_quant": "int2"}, "unknown target_quant 'int2'")])
def test_a_spec_refuses_a_value_outside_its_choices(fields, message):
    with pytest.raises(SpecdecError, match=message):
        LoadSpec(**fields)


def test_the_spec_names_the_dtypes_the_loader_takes():
    from specdec.load.spec import DTYPE_NAMES
    from specdec.models.load import DTYPES

    assert set(DTYPE_NAMES) == {"auto", *DTYPES}


def _namespace_readers(tree: ast.Module) -> list[str]:
    """Imports of argparse and parameters annotated as a Namespace, by line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            found.append(f"line {node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            found.append(f"line {node.lineno}: from argparse import ...")
        elif isinstance(node, ast.arg) and node.annotation is not None and "Namespace" in ast.unparse(node.annotation):
            found.append(f"line {node.lineno}: parameter {node.arg}: {ast.unparse(node.annotation)}")
    return found


def test_no_module_below_the_command_line_reads_a_namespace():
    below = [path for path in SOURCE.rglob("*.py") if SOURCE / "cli" not in path.parents]
    assert len(below) > 100  # the whole package was read
    found = {str(path.relative_to(SOURCE)): hits for path in below
             if (hits := _namespace_readers(ast.parse(path.read_text(encoding="utf-8"))))}
    assert found == {}


def test_the_namespace_check_finds_what_it_looks_for():
    code = "import argparse\nfrom argparse import Namespace\ndef f(args: argparse.Namespace, x: int): pass\n"
    assert len(_namespace_readers(ast.parse(code))) == 3
