"""The command line: output formats, and bad input as a one-line error with no traceback."""

import json

import pytest
import torch
from conftest import tiny_model

from specdec import PromptLookup, SpecdecError, generate
from specdec.cli import main

PROMPT = "w1 w2 w3 w1 w2 w4"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def base_args(_, *extra):
    return ["generate", "--target", "tiny", "--draft", "tiny-draft", "--raw", "--prompt", PROMPT, *extra]


# Every way generate runs a draft, each with the perturbed draft "tiny-draft" (conftest), which
# the target rejects now and then: a path that committed a wrong guess could not pass.
DRAFT_PATHS = (("draft",), ("draft", "--tree-width", "3"), ("draft", "--draft-vocab", "20"),
               ("hybrid", "--draft-int8"), ("draft:k=3:quant=int8", "--min-confidence", "0.5"))


def test_json_output_equals_plain_decoding(capsys, tiny_registry):
    runs = {}
    for proposer, *extra in (("none",), ("lookup",), *DRAFT_PATHS):
        code, out, err = run(capsys, *base_args(tiny_registry, "--json", "--proposer", proposer,
                                               "--max-new-tokens", "24", *extra))
        assert code == 0, err
        runs[" ".join([proposer, *extra])] = json.loads(out)
    plain = runs["none"]["new_tokens"]
    assert len(plain) == 24
    for name, r in runs.items():
        assert r["new_tokens"] == plain, name
    for path in DRAFT_PATHS:
        stats = runs[" ".join(path)]["stats"]
        assert 0 < stats["accepted"] < stats["proposed"], path  # guesses were both taken and refused
        assert stats["draft_calls"] > 1 and stats["target_calls"] == stats["rounds"] + 1
    stats = runs["draft"]["stats"]
    for key in ("rounds", "target_calls", "draft_calls", "proposed", "accepted", "accept_lengths",
                "position_acceptance", "times", "tokens_per_s", "mean_accepted_length"):
        assert key in stats
    assert runs["draft"]["finish_reason"] == "length"


def test_streaming_marks_draft_tokens(capsys, tiny_registry):
    code, out, err = run(capsys, *base_args(tiny_registry, "--proposer", "draft", "--max-new-tokens", "12",
                                             "--color", "always"))
    assert code == 0
    assert "\033[32m" in out  # guessed tokens are green
    assert "mean accepted length" in err


@pytest.mark.parametrize("extra,message", [
    (["-k", "0"], "-k must be >= 1"),
    (["--proposer", "draft", "--tree-width", "0"], "--tree-width must be >= 1"),
    (["--proposer", "draft", "--draft-vocab", "0"], "--draft-vocab must be >= 1"),
    (["--max-new-tokens", "0"], "max-new-tokens must be >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--temperature", "1", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--temperature", "1", "--top-k", "0"], "top_k must be >= 1"),
    # options that would be ignored, or contradict the spec, name themselves
    (["--draft-int8"], "--draft-int8 does not apply to lookup: lookup takes k=, ngram=, cat="),
    (["--tree-width", "2"], "--tree-width does not apply to lookup"),
    (["--proposer", "none", "-k", "3"], "-k does not apply to none"),
    (["--proposer", "hybrid", "--tree-width", "2"], "--tree-width does not apply to hybrid"),
    (["--proposer", "draft:k=4", "-k", "2"], "-k contradicts k=4 in draft:k=4"),
    (["--proposer", "draft:quant=int8:width=2:pay=1"], "pay=1 does not apply to a tree (width=2)"),
    (["--proposer", "draft", "--tree-width", "2", "--pay-rule", "x.json"], "pay=1 does not apply to a tree"),
    (["--proposer", "draft-int8"], "the int8 draft is written draft:quant=int8 now"),
    (["--proposer", "draft:ngram=2"], "bad option 'ngram=2' in 'draft:ngram=2'; draft takes k="),
])
def test_bad_arguments_one_line_errors(capsys, tiny_registry, extra, message):
    code, out, err = run(capsys, *base_args(tiny_registry, "--proposer", "lookup", *extra))
    assert code == 2 and out == ""
    assert error_lines(err) == 1 and message in err and "Traceback" not in err


def error_lines(err: str) -> int:
    """Lines of stderr but the line saying which target form loads (it comes before a late error)."""
    return sum(1 for line in err.splitlines() if not line.startswith("[specdec] target "))


def test_unknown_model_lists_known_names(capsys, monkeypatch):
    """Before any model file is read: on a fresh machine, auto's look at the default draft once
    assembled its GGUF first and printed the progress above the error."""
    import specdec.registry as registry

    def untouched(name):
        raise AssertionError(f"{name}'s GGUF read before the target's name was checked")

    monkeypatch.setattr(registry, "gguf_file", untouched)
    code, _, err = run(capsys, "generate", "--target", "no-such-model", "--prompt", "hi")
    assert code == 2 and "qwen2.5-coder-1.5b-instruct" in err and error_lines(err) == 1, err


def test_empty_prompt_and_missing_prompt_file(capsys, tiny_registry, tmp_path):
    code, _, err = run(capsys, "generate", "--target", "tiny", "--prompt", "  ")
    assert code == 2 and "empty" in err
    code, _, err = run(capsys, "generate", "--target", "tiny", "--proposer", "lookup", "--prompt-file", str(tmp_path / "nope"))
    assert code == 2 and "cannot read --prompt-file" in err


def test_over_long_prompt(capsys, tiny_registry):
    code, _, err = run(capsys, "generate", "--target", "tiny", "--proposer", "lookup", "--raw", "--prompt", "w1 " * 600)
    assert code == 2 and "context" in err


def test_vocabulary_mismatch_suggests_lookup(capsys, tiny_registry):
    code, _, err = run(capsys, "generate", "--target", "tiny", "--draft", "other", "--prompt", PROMPT)
    assert code == 2 and "--proposer lookup" in err


def test_check_rejects_proposer_none(capsys, tiny_registry):
    code, _, err = run(capsys, "check", "--target", "tiny", "--proposer", "none")
    assert code == 2 and "--proposer draft or lookup" in err


def test_nan_logits_are_reported_with_position():
    model = tiny_model(3)
    with torch.no_grad():
        model.lm_head.weight[5] = float("nan")
    with pytest.raises(SpecdecError, match=r"NaN/inf logits at sequence position 3"):
        generate(model, [1, 2, 3, 4], max_new_tokens=4)


class InterruptingLookup(PromptLookup):
    """Prompt lookup that is interrupted (Ctrl-C) in its third round."""

    def __init__(self):
        super().__init__(2)
        self.rounds = 0

    def begin(self, prompt, vocab_size, reuse=False):
        self.rounds = 0

    def propose(self, seq, k, cfg, generator):
        self.rounds += 1
        if self.rounds == 3:
            raise KeyboardInterrupt
        return super().propose(seq, k, cfg, generator)


def test_ctrl_c_keeps_what_was_committed(target):
    from specdec.decode.engine import GenerationInterrupted

    plain = generate(target, [1, 2, 3, 1, 2], max_new_tokens=20, eos_token_id=[]).new_tokens
    with pytest.raises(GenerationInterrupted) as caught:
        generate(target, [1, 2, 3, 1, 2], drafter=InterruptingLookup(), max_new_tokens=20, eos_token_id=[])
    result = caught.value.result
    assert result.finish_reason == "interrupted" and result.stats.rounds == 2
    assert 3 <= len(result.new_tokens) and result.new_tokens == plain[: len(result.new_tokens)]


def test_ctrl_c_in_the_cli_prints_stats(capsys, tiny_registry, monkeypatch):
    from specdec.cli import generate as command
    from specdec.load.choose import Choices
    from specdec.load.loaded import Loaded
    from specdec.methods.spec import parse
    from specdec.models.target_form import TargetForm

    form = TargetForm("none", "as --target-quant says")
    monkeypatch.setattr(command, "load", lambda spec: Loaded(*tiny_registry["tiny"], InterruptingLookup(),
                                                             Choices(spec, form, "hf", parse("lookup"))))
    code, out, err = run(capsys, *base_args(tiny_registry, "--max-new-tokens", "20"))
    assert code == 130 and "[specdec]" in err and "Traceback" not in err


# --- --proposer auto ------------------------------------------------------------------------------


def auto_args(*extra):
    return ["generate", "--target", "tiny", "--draft", "tiny-draft", "--raw", "--prompt", PROMPT, "--json",
            "--max-new-tokens", "12", *extra]


def advice_choosing(method: str, speedup: float, measured: float | None = None):
    from specdec.tune.advice import Advice, Choice

    return Advice(settings={"context": 512}, device="cpu", dtype="float32", c_target=0.3, verify={1: 0.3},
                  c_draft={}, calibration={}, proposers={}, choice=Choice(method, speedup, measured))


def setup_of(argv):
    """What the advice of a command line is keyed by."""
    from specdec.cli import build_parser
    from specdec.cli.args import spec_of
    from specdec.load.choose import place

    parsed = build_parser().parse_args(argv)
    return place(spec_of(parsed)).setup(parsed.draft_vocab)


@pytest.mark.parametrize("path, default, k", [("avx512-vnni", "hybrid:k=3:quant=int4", 3),
                                               ("avx2", "hybrid:k=3:quant=int4", 3),
                                               ("portable", "draft:k=2:quant=int8", 2)])
def test_auto_is_the_default_and_uses_the_cpu_default_without_advice(capsys, tiny_registry, monkeypatch,
                                                                       path, default, k):
    from specdec.methods.spec import parse
    from specdec.models import target_form

    monkeypatch.setattr(target_form, "kernel_path", lambda device: path)
    default = parse(default).label  # the spelling every option given: hybrid:k=3:ngram=3:quant=int4
    code, out, err = run(capsys, *auto_args())
    assert code == 0 and f"auto: {default} (no advice measured" in err
    auto = json.loads(out)
    assert auto["ran"]["method"] == default and auto["ran"]["why"].startswith(f"auto: {default} (no advice")
    assert auto["ran"]["target"]["target"] == "none"  # a folder-like name: auto keeps it dense
    code, out, _ = run(capsys, *auto_args("--proposer", "none"))
    assert auto["new_tokens"] == json.loads(out)["new_tokens"]
    assert auto["stats"]["draft_calls"] > 0 and max(auto["stats"]["proposed_lengths"]) == k


def test_auto_follows_saved_advice(capsys, tiny_registry, tmp_path):
    from specdec.models.load import resolve_dtype
    from specdec.tune.saved import advice_path, save_advice

    setup = setup_of(auto_args())
    save_advice(setup, advice_choosing("ar", 1.0))
    code, out, err = run(capsys, *auto_args())
    assert code == 0 and "auto: plain decoding (advised" in err
    assert json.loads(out)["stats"]["draft_calls"] == 0
    save_advice(setup, advice_choosing("lookup:k=3:ngram=3", 1.3))
    code, out, err = run(capsys, *auto_args("-k", "4", "--draft-int8"))  # an explicit -k wins
    assert code == 0 and "auto: lookup:k=4:ngram=3 (advised" in err and "predicted 1.30x" in err
    assert "quant=int8 not applied" in err  # said, not silently dropped
    save_advice(setup, advice_choosing("lookup:k=3:ngram=3", 1.3, 1.42))  # confirmed: both figures said
    code, _, err = run(capsys, *auto_args())
    assert code == 0 and "predicted 1.30x, measured 1.42x paired)" in err
    # another machine, dtype or model pair has its own advice; `auto` is whichever dtype this
    # CPU computes natively, so compare with the other one
    other = "float32" if resolve_dtype("auto") == "bfloat16" else "bfloat16"
    assert advice_path(setup) != advice_path(setup_of(auto_args("--dtype", other)))
    assert advice_path(setup) == advice_path(setup_of(auto_args("--dtype", resolve_dtype("auto"))))
    advice_path(setup).write_text("{not json")
    code, _, err = run(capsys, *auto_args())
    assert code == 2 and "delete it or run `specdec advise` again" in err


def test_auto_stops_by_the_pay_rule_of_the_advice_that_chose_it(capsys, tiny_registry, tmp_path):
    """advise ranks pay=1 now: where it is the choice, its cost terms come from the saved advice
    (no --pay-rule FILE to give); given, the file's."""
    from dataclasses import replace

    from specdec.tune.saved import save_advice

    advice = replace(advice_choosing("draft:k=3:pay=1", 1.3), c_draft={"draft": 0.01}, verify={1: 0.3, 2: 0.31, 3: 0.32})
    save_advice(setup_of(auto_args()), advice)
    code, out, err = run(capsys, *auto_args())
    assert code == 0 and "auto: draft:k=3:pay=1 (advised" in err
    ran = json.loads(out)
    code, plain, _ = run(capsys, *auto_args("--proposer", "none"))
    assert ran["new_tokens"] == json.loads(plain)["new_tokens"] and max(ran["stats"]["proposed_lengths"]) <= 3
    rule = tmp_path / "rule.json"
    rule.write_text(json.dumps(advice.to_json()))
    code, out, _ = run(capsys, *auto_args("--proposer", "draft:k=3", "--pay-rule", str(rule)))
    assert code == 0 and json.loads(out)["new_tokens"] == ran["new_tokens"]


def test_advice_saved_before_version_2_still_chooses(capsys, tiny_registry):
    from specdec.tune.saved import advice_path

    setup = setup_of(auto_args())
    advice_path(setup).parent.mkdir(parents=True, exist_ok=True)
    advice_path(setup).write_text(json.dumps({"setup": {}, "context": 512, "saved": "2026-11-30 10:00",
                                              "choice": {"proposer": "draft-int8", "k": 3, "predicted_speedup": 1.5}}))
    code, _, err = run(capsys, *auto_args())
    assert code == 0 and "auto: draft:k=3:quant=int8 (advised 2026-11-30 10:00 at context 512" in err


def test_advise_saves_advice_for_auto(capsys, tiny_registry, tmp_path):
    from specdec.methods.spec import parse
    from specdec.tune.advice import Advice
    from specdec.tune.saved import advice_path

    prompts = tmp_path / "calib.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2 w3 w1 w2 w3"}) + "\n")
    args = ["advise", "--target", "tiny", "--draft", "tiny-draft", "--dataset", str(prompts), "--categories", "",
            "--prompts", "1", "--context", "200", "--k-max", "3", "--calibration-k", "2", "--tokens", "6", "--raw"]
    assert main(args) == 0
    saved = json.loads(advice_path(setup_of(args)).read_text())
    assert saved["version"] == 4 and saved["setup"]["target"] == "tiny" and saved["settings"]["context"] == 200
    choice = parse(Advice.from_json(saved).choice.method)
    assert choice.kind == "ar" or choice.family().label in saved["proposers"]
    err = capsys.readouterr().err
    assert "saved for `specdec generate --proposer auto`" in err and "draft:k=2:quant=int8 proposer" in err
