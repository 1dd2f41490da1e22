"""Every option of generate and check is checked before a model loads: a bad value is the only
line printed, and nothing is loaded for it (issue 35)."""

from __future__ import annotations

import pytest

from specdec.cli import main


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any attempt to load the target fails the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr("specdec.load.loaded.load_target", refuse)


GENERATE = ["generate", "--target", "tiny", "--draft", "tiny-draft", "--raw", "--prompt", "w1 w2"]


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--temperature", "nan"], "temperature must be >= 0"),
    (["--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--temperature", "1", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--temperature", "1", "--top-k", "0"], "top_k must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--target-quant", "int4", "--quant-group", "48"], "the int4 group size must be one of"),
    (["--target-quant", "int8", "--device", "cuda"], "int8 weights run on torch's CPU kernels"),
    (["--draft-quant", "int3", "--runtime", "hf"], "int3 weights run on specdec's native runtime only"),
    (["--proposer", "draft:quant=int3", "--runtime", "hf"], "int3 weights run on specdec's native runtime only"),
])
def test_generate_says_only_what_is_wrong(capsys, nothing_loads, extra, message):
    code = main([*GENERATE, *extra])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and message in err, err


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "0"], "--prompts must be >= 1"),
    (["--tokens", "-3"], "--tokens must be >= 1"),
    (["--samples", "0"], "--samples must be >= 1"),
    (["--proposer", "draft:k=2:quant=int3", "--runtime", "hf"], "int3 weights run on specdec's native runtime only"),
    (["--target-quant", "int4", "--quant-group", "48"], "the int4 group size must be one of"),
])
def test_check_says_only_what_is_wrong(capsys, nothing_loads, extra, message):
    code = main(["check", "--target", "tiny", "--draft", "tiny-draft", *(extra if "--proposer" in extra
                                                                         else ["--proposer", "lookup", *extra])])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and message in err, err


def test_the_default_says_once_what_advise_may_gain(monkeypatch, tmp_path):
    """Before any advice, the first run of the default says what advise gained where measured
    and how long it takes; later runs do not repeat it."""
    from specdec.tune import saved

    monkeypatch.setattr(saved, "advice_dir", lambda: tmp_path / "advice")
    first, second = saved._advise_hint_once(), saved._advise_hint_once()
    assert "5-13 minutes" in first and "within 1%" in first and second == ""
