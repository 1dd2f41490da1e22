"""What runs by default (issue 25): the candidates advise ranks, the target form auto picks, the
paired confirmation's choice, llama.cpp's comparison, and older advice records."""

import pytest

from specdec.cost.model import Acceptance, Costs, Rounds, predicted_speedup
from specdec.methods.spec import Method, parse
from specdec.models import target_form
from specdec.models.target_form import choose_form
from specdec.tune.advice import Advice, Choice, Confirmed
from specdec.tune.advise import MIN_GAIN, ranking, recommend
from specdec.tune.calibration import Calibration
from specdec.tune.candidates import HEAD, candidates, hybrid_of, round_variants
from specdec.tune.confirm import confirmed_choice
from specdec.tune.versus import against_llamacpp, llamacpp_available

TARGET = "qwen2.5-coder-1.5b-instruct"


def labels(methods):
    return [m.label for m in methods]


def test_candidates_cover_every_draft_form_and_lookup():
    assert labels(candidates(True, "cpu", vocab_size=151936)) == [
        "draft", "draft:quant=int8", "draft:quant=int4", "draft:quant=int4:vocab=32768", "lookup:ngram=3"]
    # a small vocabulary gains nothing from a restricted head; a GPU runs the dense draft only
    assert labels(candidates(True, "cpu", vocab_size=HEAD)) == [
        "draft", "draft:quant=int8", "draft:quant=int4", "lookup:ngram=3"]
    assert labels(candidates(True, "cuda", vocab_size=151936)) == ["draft", "draft:vocab=32768", "lookup:ngram=3"]
    # given options are fixed; quick keeps the dense and the cheapest form
    assert labels(candidates(True, "cpu", "int8", 1000, 151936)) == ["draft:quant=int8:vocab=1000", "lookup:ngram=3"]
    assert labels(candidates(True, "cpu", vocab_size=151936, quick=True)) == ["draft", "draft:quant=int4", "lookup:ngram=3"]
    assert labels(candidates(False, "cpu", vocab_size=151936)) == ["lookup:ngram=3"]
    # a draft on the native runtime also runs int3, and its head is restricted in int4 and int3
    assert labels(candidates(True, "cpu", vocab_size=151936, native=True)) == [
        "draft", "draft:quant=int8", "draft:quant=int4", "draft:quant=int3", "draft:quant=int4:vocab=32768",
        "draft:quant=int3:vocab=32768", "lookup:ngram=3"]
    assert hybrid_of(Method("draft", quant="int4", vocab=HEAD)).label == "hybrid:ngram=3:quant=int4:vocab=32768"


def test_round_options_of_a_family_at_its_k():
    assert labels(round_variants(parse("draft:k=2:quant=int4"))) == [
        "draft:k=2:quant=int4:width=2", "draft:k=2:quant=int4:width=3", "draft:k=2:quant=int4:conf=0.6",
        "draft:k=2:quant=int4:dyn=1", "draft:k=2:quant=int4:pay=1"]
    # the hybrid takes no width; at k=1 a stop or a schedule changes nothing
    assert labels(round_variants(parse("hybrid:k=3:quant=int4"))) == [
        "hybrid:k=3:ngram=3:quant=int4:conf=0.6", "hybrid:k=3:ngram=3:quant=int4:dyn=1",
        "hybrid:k=3:ngram=3:quant=int4:pay=1"]
    assert labels(round_variants(parse("draft:k=1"))) == ["draft:k=1:width=2", "draft:k=1:width=3"]
    assert round_variants(parse("hybrid:k=1")) == []


def test_round_options_go_to_the_best_family_of_each_kind():
    """The best draft form and the hybrid get theirs at the best k of their curve, also where
    the chain does not pay; lookup takes none. From a saved run: the ones it calibrated."""
    from specdec.tune.advice import Verdict
    from specdec.tune.advise import _round_options

    curve = lambda *speedups: Verdict(0, 1.0, "", speedup_by_k=dict(enumerate(speedups, 1)))
    families = [Method("draft"), Method("draft", quant="int4"), Method("lookup", ngram=3), hybrid_of(Method("draft"))]
    verdicts = {"draft": curve(0.8, 0.9, 0.7), "draft:quant=int4": curve(0.9, 0.95, 0.97),
                "lookup:ngram=3": curve(1.1, 1.2), "hybrid:ngram=3": Verdict(0, None, "never proposed")}
    chosen = _round_options(verdicts, families, None)
    assert labels(chosen) == labels(round_variants(parse("draft:k=3:quant=int4")))
    saved = Advice.from_json(VERSION_2 | {"calibration": {
        name: {"rates": [0.5], "hit_rate": 1.0} for name in ("draft", "draft:k=2:width=2", "lookup:ngram=3",
                                                              "draft:k=2:quant=int8:pay=1")}})
    assert labels(_round_options(verdicts, families, saved)) == ["draft:k=2:width=2"]


def calibration(rates, hit=1.0, share=1.0):
    return Calibration(Acceptance(tuple(rates), hit), [], 0.5, 0.0, 0.0, 0.0, draft_share=share)


def test_a_hybrid_round_pays_its_draft_only_in_draft_rounds():
    verify = {k: 0.1 + 0.01 * k for k in range(1, 7)}
    cal = calibration([0.8] * 4, share=0.25)
    per, _ = recommend(0.1, verify, 0.0, {Method("hybrid", ngram=3): (0.04, cal)}, 6)
    expected = predicted_speedup(Costs(0.1, 0.01, verify), cal.acceptance, 3)
    assert per["hybrid:ngram=3"].speedup_by_k[3] == pytest.approx(expected)
    # the same acceptance with a draft in every round is slower
    as_draft, _ = recommend(0.1, verify, 0.0, {Method("draft"): (0.04, calibration([0.8] * 4))}, 6)
    assert as_draft["draft"].speedup_by_k[3] < per["hybrid:ngram=3"].speedup_by_k[3]


def test_ranking_orders_the_paying_families_at_their_best_k():
    verify = {k: 0.1 + 0.005 * k for k in range(1, 7)}
    families = {Method("draft"): (0.03, calibration([0.9] * 4)), Method("draft", quant="int4"): (0.01, calibration([0.85] * 4)),
                Method("lookup", ngram=3): (0.0, calibration([0.0] * 4, hit=0.1))}
    per, choice = recommend(0.1, verify, 0.0, families, 6)
    top = ranking(per, list(families))
    assert [m.family().label for m, _ in top] == ["draft:quant=int4", "draft"]  # lookup never pays here
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert top[0][0].k == per["draft:quant=int4"].k and choice.method == top[0][0].label


def confirmed(method, predicted, measured):
    return Confirmed(method, predicted, measured, 10.0 * measured, 10.0, 4, 48)


def test_the_choice_is_the_fastest_as_measured():
    runs = [confirmed("draft:k=3:quant=int4", 2.0, 1.4), confirmed("hybrid:k=3:quant=int4", 1.9, 1.6)]
    choice = confirmed_choice(runs, MIN_GAIN)
    assert (choice.method, choice.predicted_speedup, choice.measured_speedup) == ("hybrid:k=3:quant=int4", 1.9, 1.6)
    slow = confirmed_choice([confirmed("lookup:k=2:ngram=3", 1.2, 0.9)], MIN_GAIN)
    assert slow.method == "ar" and slow.measured_speedup is None and "0.90x" in slow.reason


@pytest.mark.parametrize("path, device, form", [("avx512-vnni", "cpu", "int4"), ("avx2", "cpu", "int4"),
                                                ("portable", "cpu", "none"), (None, "cuda", "none")])
def test_target_auto_picks_int4_where_the_kernels_run(monkeypatch, path, device, form):
    monkeypatch.setattr(target_form, "kernel_path", lambda d: path)
    chosen = choose_form("auto", TARGET, device)
    assert chosen.quant == form and chosen.reason.startswith("auto:")
    assert choose_form("none", TARGET, device).quant == "none"  # explicit wins
    assert choose_form("int8", TARGET, device).reason == "as --target-quant says"
    assert choose_form("auto", "/some/folder", device).quant == "none"  # a folder ships dense


def test_kernel_path_is_none_off_the_cpu():
    assert target_form.kernel_path("cuda:0") is None


def test_llamacpp_against_the_choice():
    record = {"gguf": "x.gguf", "tokens_per_s": 20.0}
    measured = against_llamacpp(record, 10.0, Choice("hybrid:k=3", 2.5, 2.4))
    assert measured["plain_over_llamacpp"] == 0.5 and measured["choice_over_llamacpp"] == pytest.approx(1.2)
    assert measured["choice_from"] == "measured"
    predicted = against_llamacpp(record, 10.0, Choice("hybrid:k=3", 2.5))
    assert predicted["choice_over_llamacpp"] == pytest.approx(1.25) and predicted["choice_from"] == "predicted"
    assert llamacpp_available("/some/folder") in ("the target is a local folder: no GGUF of it to run",
                                                  "llama-cpp-python is not installed (bash scripts/setup_llamacpp.sh)")


VERSION_2 = {
    "version": 2, "settings": {"context": 512}, "device": "cpu", "dtype": "bfloat16", "c_target": 0.1,
    "verify": {"1": 0.11}, "c_draft": {"draft:quant=int8": 0.02},
    "calibration": {"draft:quant=int8": {"rates": [0.8, 0.7], "hit_rate": 1.0}},
    "proposers": {"draft:quant=int8": {"k": 2, "speedup": 1.6, "reason": "r", "speedup_by_k": {"1": 1.3, "2": 1.6}}},
    "choice": {"method": "draft:k=2:quant=int8", "predicted_speedup": 1.6},
}


def test_older_advice_records_still_load():
    old = Advice.from_json(VERSION_2)
    assert old.choice == Choice("draft:k=2:quant=int8", 1.6) and old.confirmed == [] and old.not_ranked == {}
    assert old.calibration["draft:quant=int8"].draft_share == 1.0 and old.proposers["draft:quant=int8"].speedup_by_k[2] == 1.6
    with pytest.raises(ValueError, match="reads 1 to 4"):
        Advice.from_json(VERSION_2 | {"version": 9})
    # version 3 (the confirmation, no rounds) reads as version 2 plus what it has
    run = vars(confirmed("draft:k=2:quant=int8", 1.6, 1.5))
    three = Advice.from_json(VERSION_2 | {"version": 3, "confirmed": [run]})
    assert three.confirmed[0].measured_speedup == 1.5 and three.calibration["draft:quant=int8"].rounds is None


def test_a_version_4_record_round_trips():
    """Through JSON text: the rounds' block sizes come back as ints, a round option's verdict
    and calibration by its full spec."""
    import json
    from dataclasses import replace

    from specdec.tune.advice import Calibrated, Verdict

    record = Advice.from_json(VERSION_2)
    tree = "draft:k=2:quant=int8:width=2"
    rounds = Rounds(1.75, {0: 0.125, 4: 0.875}, 2.5)
    new = replace(record, confirmed=[confirmed(tree, 1.7, 1.5)], choice=Choice(tree, 1.7, 1.5, "measured"),
                  calibration=record.calibration | {tree: Calibrated((0.8, 0.5), 1.0, rounds=rounds)},
                  proposers=record.proposers | {tree: Verdict(2, 1.7, "r", speedup_by_k={2: 1.7}, hit_rate=1.0)},
                  llamacpp={"tokens_per_s": 9.0}, not_ranked={"x": "why"})
    data = json.loads(json.dumps(new.to_json()))
    assert data["version"] == 4 and data["calibration"][tree]["rounds"]["blocks"] == {"0": 0.125, "4": 0.875}
    assert Advice.from_json(data) == new and Advice.from_json(data).calibration[tree].rounds.nodes == 3.5
    assert parse(Advice.from_json(data).choice.method).width == 2


def test_confirm_runs_each_method_paired_with_plain_decoding(target, monkeypatch):
    """confirm() alternates plain and method per prompt (A-B, then B-A) after a discarded warm-up,
    and its measured speedup is the pooled tokens/s ratio of the two sides."""
    from specdec.decode import engine
    from specdec.methods.build import Drafts
    from specdec.tune import confirm as confirm_module

    calls = []
    real = engine.generate

    def recording(model, prompt, drafter=None, max_new_tokens=0, **kw):
        calls.append(("plain" if drafter is None else "method", len(prompt), max_new_tokens))
        return real(model, prompt, drafter=drafter, max_new_tokens=max_new_tokens, **kw)

    monkeypatch.setattr(engine, "generate", recording)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6, 4]]
    [done] = confirm_module.confirm(target, Drafts(None), [(parse("lookup:k=2:ngram=2"), 1.3)], prompts, 6)
    warm = confirm_module.WARMUP_TOKENS
    assert calls == [("plain", 8, warm), ("method", 8, warm),
                     ("plain", 8, 6), ("method", 8, 6), ("method", 7, 6), ("plain", 7, 6)]
    assert (done.method, done.predicted_speedup, done.prompts, done.tokens) == ("lookup:k=2:ngram=2", 1.3, 2, 6)
    assert done.tokens_per_s > 0 and done.plain_tokens_per_s > 0
    assert done.measured_speedup == pytest.approx(done.tokens_per_s / done.plain_tokens_per_s)


def test_configs_record_the_runtime_the_target_runs_on(tmp_path):
    """The Choices record (configs, advice, generate --json) says where the target runs: the
    native runtime for a registry model in int4 on the CPU under runtime auto, transformers' model
    for a folder, under runtime hf (advise on random weights asks for it: transformers' models);
    saved advice is keyed by it, so advice measured on one runtime never picks for the other."""
    from dataclasses import replace

    from specdec.load import LoadSpec
    from specdec.load.choose import place

    int4 = LoadSpec(TARGET, target_quant="int4")
    assert place(int4).record()["runtime"] == "native"
    assert place(replace(int4, runtime="hf")).record()["runtime"] == "hf"
    assert place(replace(int4, target_quant="none")).record()["runtime"] == "hf"
    assert place(replace(int4, target=str(tmp_path))).record()["runtime"] == "hf"
    native, hf = (place(replace(int4, runtime=r)).setup(None) for r in ("auto", "hf"))
    assert native.target.endswith(", native runtime") and native.target.removesuffix(", native runtime") == hf.target


def test_the_default_restricts_the_draft_head_only_where_the_vocabulary_is_larger(monkeypatch, tmp_path):
    """Before any advice, where the draft does not run int3 (no `runs` given): on a kernel CPU
    the hybrid over the int4 draft with a 32768-id head for a draft of more ids (Qwen's 151936),
    the full head for fewer or an unknown vocabulary;
    draft_vocabulary reads a folder's config and fetches nothing for other names."""
    from transformers import Qwen2Config

    from specdec.load import LoadSpec
    from specdec.load.choose import draft_vocabulary
    from specdec.models import target_form
    from specdec.tune.saved import default_choice

    monkeypatch.setattr(target_form, "kernel_path", lambda device: "avx512-vnni")
    assert default_choice("cpu", 151936).label == "hybrid:k=3:ngram=3:quant=int4:vocab=32768"
    assert default_choice("cpu", 32768).label == default_choice("cpu", None).label == "hybrid:k=3:ngram=3:quant=int4"
    monkeypatch.setattr(target_form, "kernel_path", lambda device: "portable")
    assert default_choice("cpu", 151936).label == "draft:k=2:quant=int8"
    Qwen2Config(vocab_size=1000).save_pretrained(tmp_path)
    assert draft_vocabulary(LoadSpec(draft=str(tmp_path))) == 1000
    assert draft_vocabulary(LoadSpec(draft="none")) is None
    assert draft_vocabulary(LoadSpec(draft="no/such-model")) is None


@pytest.mark.parametrize("flags, kind, default", [
    ({"avx512_vnni", "avx512_bf16", "amx_tile"}, "cpu-amx", "draft:k=5:quant=int3:vocab=32768:conf=0.6"),  # AMX Xeon
    ({"avx512_vnni", "avx512_bf16"}, "cpu-bf16", "draft:k=4:quant=int3:vocab=32768:conf=0.6"),  # Zen 5
    ({"avx512_vnni"}, "cpu-kernels", "draft:k=3:quant=int3:vocab=32768:conf=0.6")])  # Ice Lake Xeon
def test_the_default_is_what_advise_chose_on_each_kind_of_cpu(monkeypatch, flags, kind, default):
    """Before advice, a kernel CPU runs advise's choice on the machine of its kind (issue 35):
    the int3 draft, where the draft runs on the native runtime; else the int4 hybrid."""
    from specdec import machine
    from specdec.tune.saved import NOT_NATIVE_DEFAULT, default_choice, device_kind

    monkeypatch.setattr(target_form, "kernel_path", lambda d: "avx512-vnni")
    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    assert device_kind("cpu") == kind
    assert default_choice("cpu", 151936, lambda quant: True).label == parse(default).label
    # a draft not on the native runtime (--runtime hf, a folder) cannot run int3: the int4 hybrid
    assert default_choice("cpu", 151936, lambda quant: quant != "int3").label == parse(NOT_NATIVE_DEFAULT).label
    assert default_choice("cpu", 151936).label == parse(NOT_NATIVE_DEFAULT).label  # unknown: every runtime's forms
    assert default_choice("cpu", 32000, lambda quant: True).vocab is None  # no larger head to restrict


@pytest.mark.parametrize("path, kind, default", [("portable", "cpu", "draft:k=2:quant=int8"), (None, "other", "draft:k=2")])
def test_the_default_without_the_kernels_vector_path(monkeypatch, path, kind, default):
    from specdec.tune.saved import default_choice, device_kind

    monkeypatch.setattr(target_form, "kernel_path", lambda d: path)
    device = "cpu" if path else "cuda"
    assert device_kind(device) == kind and default_choice(device, 151936, lambda quant: True).label == default


@pytest.mark.parametrize("fields, runs", [({}, True), ({"runtime": "hf"}, False), ({"draft": "/some/folder"}, False),
                                          ({"runtime": "native", "draft": "/some/folder"}, False),
                                          ({"device": "cuda"}, False)])
def test_auto_asks_whether_the_draft_runs_int3(fields, runs):
    """The int3 default only where the draft runs on the native runtime; no model is read for it."""
    from specdec.load import LoadSpec
    from specdec.load.choose import draft_runs

    spec = LoadSpec(**fields)
    assert draft_runs(spec, "int3") is runs and draft_runs(spec, "int4") and draft_runs(spec, None)
