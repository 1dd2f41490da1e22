"""`specdec generate --json-schema FILE` and `--grammar FILE` on the tiny GGUF pair (tests/
serve_native.py's files, native runtime): the output validates and speculative equals plain
decoding under the same file; a bad file is a one-line error before any model loads."""

from __future__ import annotations

import json

import jsonschema
import pytest
from serve_native import gguf_pair
from test_cli import run

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["answer", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli-structured")
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    (folder / "yes_no.gbnf").write_text('root ::= ("yes" | "no") ", " [0-9]')
    return folder, gguf_pair(folder)


@pytest.fixture
def cached(pair, monkeypatch):
    from specdec.gguf import store

    monkeypatch.setattr(store, "cache_root", lambda: pair[0] / "cache")
    return pair


def args(pair, proposer: str, *extra: str) -> list[str]:
    folder, (target, draft) = pair
    return ["generate", "--target", target, "--draft", draft, "--runtime", "native", "--proposer", proposer,
            "--prompt", "Say yes or no", "--json", "--max-new-tokens", "120", *extra]


@pytest.mark.parametrize("flag,file", [("--json-schema", "schema.json"), ("--grammar", "yes_no.gbnf")])
def test_the_output_matches_and_speculation_equals_plain_decoding(capsys, cached, flag, file):
    outputs = {}
    for proposer in ("none", "draft:k=3", "lookup"):
        code, out, err = run(capsys, *args(cached, proposer, flag, str(cached[0] / file)))
        assert code == 0, err
        outputs[proposer] = json.loads(out)
    plain = outputs["none"]
    assert all(o["new_tokens"] == plain["new_tokens"] for o in outputs.values())
    if flag == "--json-schema":
        jsonschema.validate(json.loads(plain["text"]), SCHEMA)
    else:
        answer, digit = plain["text"].split(", ")
        assert answer in ("yes", "no") and digit.isdigit() and len(digit) == 1


@pytest.mark.parametrize("flags,message", [
    (("--json-schema", "missing.json"), "--json-schema: cannot read"),
    (("--json-schema", "yes_no.gbnf"), "is not JSON"),
    (("--grammar", "schema.json"), "is not a usable GBNF grammar"),
])
def test_a_bad_file_is_a_one_line_error_before_loading(capsys, pair, flags, message):
    flag, name = flags
    code, _, err = run(capsys, *args(pair, "draft:k=3", flag, str(pair[0] / name)))
    assert code != 0 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
