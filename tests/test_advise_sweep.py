"""`specdec advise` and `specdec sweep` end to end: tiny models through the CLI, and the real
SmolLM2 weights (marked real)."""

import json

import pytest

from specdec.bench.store import read_rows
from specdec.cli import main


def write_prompts(tmp_path):
    path = tmp_path / "calib.jsonl"
    texts = ["w1 w2 w3 w4 w1 w2 w3", "w5 w6 w7 w5 w6", "w9 w8 w7 w6 w5 w4"]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


def test_advise_json_on_tiny_models(tiny_registry, tmp_path, capsys):
    """The advice is the cost model's answer to its own measurements: every figure below is
    recomputed from the report (or the models) by hand, with a draft that the target rejects
    sometimes."""
    from dataclasses import replace

    from conftest import tiny_model

    from specdec.cost.model import Acceptance
    from specdec.methods.spec import parse
    from specdec.tune.advise import MIN_GAIN
    from specdec.tune.candidates import NOT_RANKED, round_variants
    from specdec.tune.measure import BANDWIDTH_BOUND

    args = ["advise", "--target", "tiny", "--draft", "tiny-draft", "--dataset", str(write_prompts(tmp_path)),
            "--categories", "", "--prompts", "2", "--context", "400", "--k-max", "4", "--calibration-k", "3",
            "--tokens", "8", "--raw", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"] == 4 and report["calibration_prompts"] == ["1", "2"]
    assert set(report["verify"]) == {"1", "2", "3", "4"} and report["c_target"] > 0
    # on a CPU every weight form of the draft is timed once (no restricted head: a 64-id vocabulary)
    forms = ["draft", "draft:quant=int8", "draft:quant=int4"]
    assert list(report["c_draft"]) == forms and min(report["c_draft"].values()) > 0
    # every family ranked: the draft forms, lookup, and the hybrid over the draft form predicted best
    ranked = list(report["calibration"])
    assert ranked == list(report["proposers"]) and ranked[:4] == [*forms, "lookup:ngram=3"]
    best_draft = max(forms, key=lambda f: report["proposers"][f]["speedup"])
    assert ranked[4] == "hybrid:ngram=3" + best_draft.removeprefix("draft")
    assert 0 <= report["calibration"][ranked[4]]["draft_share"] <= 1
    assert report["environment"]["methods"] == ranked[:4]
    assert report["not_ranked"] == NOT_RANKED and report["settings"]["round_options"] is True
    # then the round options of the best draft form and of the hybrid, each at the best k of its curve
    at_best = {}
    for name in ranked[:5]:
        curve = {int(k): s for k, s in report["proposers"][name]["speedup_by_k"].items()}
        at_best[name] = (max(curve.values()), replace(parse(name), k=max(curve, key=lambda k: (curve[k], -k))))
    best_form = max(forms, key=lambda f: at_best[f][0])
    assert ranked[5:] == [m.label for name in (best_form, ranked[4]) for m in round_variants(at_best[name][1])]
    assert any(parse(name).width for name in ranked[5:])  # trees are among them at any k
    for name in ranked[5:]:  # each priced from what its own rounds did
        method, rounds, verdict = parse(name), report["calibration"][name]["rounds"], report["proposers"][name]
        assert list(verdict["speedup_by_k"]) == [str(method.k)] and verdict["reason"].startswith("a round took")
        nodes = sum(int(n) * share for n, share in rounds["blocks"].items())
        assert 0 <= rounds["draft_steps"] <= method.k and 1 <= rounds["tokens"] <= method.k + 1
        if method.width:  # a draft step per chain token, width nodes per step
            assert nodes == pytest.approx(method.width * rounds["draft_steps"]), name
        elif method.kind == "draft":
            assert nodes == pytest.approx(rounds["draft_steps"]), name
        else:  # a hybrid's lookup rounds take no draft step
            assert nodes >= rounds["draft_steps"] - 1e-9, name
    assert report["environment"]["quant"]["target"] == "none" and "auto" in report["environment"]["quant"]["target_reason"]
    # calibration: a perturbed draft, refused now and then; E[tokens/round] from the rates
    for name, c in report["calibration"].items():
        acc = Acceptance(tuple(c["rates"]), c["hit_rate"])
        assert c["expected_tokens_measured"] == pytest.approx(acc.expected_tokens), name
    assert 0 < report["calibration"]["draft"]["rates"][0] < 1
    # each proposer's best k is the argmax of its own curve (k=0, plain decoding, where no k
    # beats it), the choice the best proposer
    best = None
    for name, v in report["proposers"].items():
        curve = {int(k): s for k, s in v["speedup_by_k"].items()}
        top = max(curve, key=lambda k: (curve[k], -k))
        assert (v["k"], v["speedup"]) == ((top, curve[top]) if curve[top] > 1 else (0, 1.0)), name
        if best is None or v["speedup"] > report["proposers"][best]["speedup"]:
            best = name
    # the top 3 that pay at all are confirmed, predicted against measured; the choice is the
    # fastest as measured (plain decoding where none measured MIN_GAIN)
    paying = sorted((v["speedup"], n) for n, v in report["proposers"].items() if v["k"] > 0)[::-1][:3]
    confirmed = report["confirmed"]
    assert [c["method"] for c in confirmed] == [replace(parse(n), k=report["proposers"][n]["k"]).label
                                                for _, n in paying]
    for c, (speedup, _) in zip(confirmed, paying):
        assert c["predicted_speedup"] == speedup and c["prompts"] == 2 and c["tokens"] == 8
        assert c["measured_speedup"] == pytest.approx(c["tokens_per_s"] / c["plain_tokens_per_s"])
    chosen = parse(report["choice"]["method"])
    if confirmed:
        fastest = max(confirmed, key=lambda c: c["measured_speedup"])
        if fastest["measured_speedup"] >= MIN_GAIN:
            assert report["choice"]["method"] == fastest["method"]
            assert report["choice"]["measured_speedup"] == fastest["measured_speedup"]
        else:
            assert chosen.kind == "ar"
    else:
        assert chosen.kind == "ar" and report["proposers"][best]["speedup"] < MIN_GAIN
    # bandwidth: the bytes a step reads (float32 weights + the formula's KV) over its time
    model = tiny_model(1)
    c = model.config
    # float32 weights but the untied input embedding, of which a step reads one row
    weights = (sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()) * 4
    kv = 2 * c.num_hidden_layers * 400 * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    bw = report["bandwidth"]
    assert report["memory"]["target"] == {"weights": weights, "kv_cache": kv} and bw["bytes_per_step"] == weights + kv
    assert bw["bytes_per_s"] == pytest.approx(bw["bytes_per_step"] / report["c_target"])
    assert bw["share_of_read_bandwidth"] == pytest.approx(bw["bytes_per_s"] / bw["read_bytes_per_s"])
    assert bw["verify4_over_step"] == pytest.approx(report["verify"]["4"] / report["c_target"])
    rule = ("compute" if bw["share_of_read_bandwidth"] < BANDWIDTH_BOUND
            else "bandwidth" if bw["verify4_over_step"] < 1.5 else "mixed")
    assert bw["bound"] == rule
    assert main([a for a in args if a != "--json"]) == 0
    text = capsys.readouterr().out
    assert "Recommendation: " in text and "C_V(k) in target steps" in text  # a second measurement: its own choice
    assert "draft steps, " in text and "tokens verified" in text


def test_quick_advise_leaves_the_round_options_out(tiny_registry, tmp_path, capsys):
    from specdec.methods.spec import parse
    from specdec.tune.candidates import NOT_RANKED, QUICK

    assert main(["advise", "--target", "tiny", "--draft", "tiny-draft", "--dataset", str(write_prompts(tmp_path)),
                 "--categories", "", "--prompts", "2", "--context", "400", "--k-max", "3", "--calibration-k", "3",
                 "--tokens", "8", "--raw", "--json", "--quick"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = list(report["proposers"])
    assert names[:3] == ["draft", "draft:quant=int4", "lookup:ngram=3"] and len(names) == 4
    assert names[3].startswith("hybrid:ngram=3")
    assert all(parse(name).family().label == name for name in names)  # no k: no round option
    assert report["not_ranked"] == NOT_RANKED | QUICK and report["settings"]["round_options"] is False
    assert report["confirmed"] == [] and report["choice"]["measured_speedup"] is None


def test_sweep_writes_rows_resumes_and_reports(tiny_registry, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--target", "tiny", "--draft", "tiny", "--contexts", "400,450", "--tokens", "6",
            "--repeats", "1", "--ks", "1,2", "--methods", "draft:k=2,lookup:k=3", "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    assert [r["context"] for r in rows] == [400, 450]
    for r in rows:
        assert r["kv_bytes"]["target"]["measured"] == r["kv_bytes"]["target"]["formula"]
        # the timed k: --ks plus every method's own k
        assert r["c_target"] > 0 and set(r["verify"]) == {"1", "2", "3"} and r["peak_memory_bytes"] > 0
        for name in ("draft:k=2", "lookup:k=3:ngram=3"):
            m = r["methods"][name]
            assert m["equal_to_ar"] and m["predicted_speedup"] > 0 and m["speedup"] > 0
        assert r["methods"]["draft:k=2"]["mean_accepted_length"] == pytest.approx(3.0, abs=0.5)
        assert list(r["c_draft"]) == ["draft"] and r["c_draft"]["draft"] > 0
    assert (out / "sweep.png").stat().st_size > 0 and "| 450 |" in (out / "sweep.md").read_text()
    # Resuming with one more context runs only that one; finished rows stay as they were.
    assert main(args[:6] + ["500,400,450"] + args[7:] + ["--resume"]) == 0
    again = read_rows(out)
    assert again[:2] == rows and [r["context"] for r in again] == [400, 450, 500]
    assert "| 500 |" in (out / "sweep.md").read_text()
    # Another setting than the folder's is refused.
    assert main(args[:8] + ["9"] + args[9:] + ["--resume"]) == 2
    assert "differs from this run in settings" in capsys.readouterr().err


def test_sweep_refuses_bad_arguments(tiny_registry, tmp_path, capsys):
    base = ["sweep", "--target", "tiny", "--out", str(tmp_path / "x")]
    assert main(base + ["--contexts", "2048,abc"]) == 2
    assert main(base + ["--methods", "medusa:k=2"]) == 2
    assert main(base + ["--draft", "none", "--methods", "draft:k=2"]) == 2
    err = capsys.readouterr().err
    assert "comma list of integers" in err and "unknown method 'medusa'" in err and "need a draft model" in err


def test_sweep_labels_what_it_runs(tiny_registry, tmp_path):
    """--draft-int8 is a method option: the rows, the table and the config name the int8 draft."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--target", "tiny", "--draft", "tiny-draft", "--contexts", "400", "--tokens", "4",
                 "--repeats", "1", "--ks", "1", "--methods", "draft:k=2", "--draft-int8", "--out", str(out)]) == 0
    row, = read_rows(out)
    assert list(row["methods"]) == ["ar", "draft:k=2:quant=int8"] and list(row["c_draft"]) == ["draft:quant=int8"]
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["methods"] == config["environment"]["methods"] == ["draft:k=2:quant=int8"]
    assert "draft:k=2:quant=int8" in (out / "sweep.md").read_text()
    for refused in ("hybrid:k=2", "draft:k=2:conf=0.5", "draft:k=2:cat=1"):
        assert main(["sweep", "--target", "tiny", "--methods", refused, "--out", str(tmp_path / "x")]) == 2


@pytest.mark.real
def test_sweep_and_advise_on_smollm2(tmp_path, capsys):
    name = "smollm2-135m-instruct"
    out = tmp_path / "sweep"
    assert main(["sweep", "--target", name, "--draft", name, "--contexts", "512,1024", "--tokens", "12",
                 "--repeats", "1", "--ks", "1,2,4", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [r["context"] for r in rows] == [512, 1024]
    for r in rows:
        assert all(m["equal_to_ar"] for m in r["methods"].values())
        assert r["kv_bytes"]["target"]["measured"] == r["kv_bytes"]["target"]["formula"]
    assert main(["advise", "--target", name, "--draft", name, "--context", "256", "--k-max", "4",
                 "--prompts", "2", "--tokens", "12", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration"]["draft"]["rates"][0] > 0.9  # self-draft
    assert report["choice"]["method"]
    # measured where generate runs: the int4 target on the native runtime where the kernels run
    quant = report["environment"]["quant"]
    assert quant["runtime"] == ("native" if quant["target"].startswith("int4") else "hf")
    if quant["runtime"] == "native":
        assert report["dtype"] == "float32"  # its activations, whatever --dtype says


def test_advise_with_random_weights_takes_saved_acceptance(tiny_registry, tmp_path, capsys):
    """Measured acceptance from one run (real weights), costs timed on random weights of the
    same shapes elsewhere: the second report carries the first's acceptance and its own costs."""
    from conftest import tiny_model

    common = ["--dataset", str(write_prompts(tmp_path)), "--categories", "", "--prompts", "2",
              "--context", "400", "--k-max", "3", "--calibration-k", "3", "--tokens", "8", "--raw", "--json"]
    assert main(["advise", "--target", "tiny", "--draft", "tiny", *common]) == 0
    measured = json.loads(capsys.readouterr().out)
    saved = tmp_path / "measured.json"
    saved.write_text(json.dumps(measured))
    shapes = tmp_path / "shapes"
    tiny_model(1).config.save_pretrained(shapes)  # config.json only: no weights anywhere
    assert main(["advise", "--target", str(shapes), "--draft", str(shapes), "--random-weights",
                 "--acceptance", str(saved), *common]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["random_weights"] and report["acceptance_from"] == "saved"
    # acceptance from elsewhere: nothing is confirmed (the measured run confirms what pays on the
    # tiny models, which depends on this machine's timings: tests/test_defaults.py fixes them)
    assert report["confirmed"] == [] and measured["acceptance_from"] == "measured"
    for name in measured["calibration"]:
        assert report["calibration"][name]["rates"] == measured["calibration"][name]["rates"]
        assert report["calibration"][name]["hit_rate"] == measured["calibration"][name]["hit_rate"]
        assert report["calibration"][name]["rounds"] == measured["calibration"][name]["rounds"]
    # the round options measured there are priced here, from their rounds and these costs
    options = [name for name in measured["calibration"] if ":k=" in name]
    assert options and all(report["proposers"][name]["speedup_by_k"] for name in options)
    assert report["c_target"] > 0 and report["c_draft"]["draft"] > 0 and report["choice"]["method"]
    assert main(["advise", "--target", str(shapes), "--random-weights", *common]) == 2
    assert "add --acceptance FILE" in capsys.readouterr().err


# The published parameter counts (494,032,768 and 1,543,714,304 with tied embeddings) plus the
# output layer, which these checkpoints store untied (vocab 151936 x hidden 896 / 1536).
@pytest.mark.parametrize("name, params", [("qwen2.5-coder-0.5b-instruct", 494_032_768 + 151936 * 896),
                                          ("qwen2.5-coder-1.5b-instruct", 1_543_714_304 + 151936 * 1536)])
def test_random_model_has_the_real_shapes(name, params):
    from specdec.models.load import random_model

    model = random_model(name, "bfloat16", device="meta")  # shapes only, nothing allocated
    assert sum(p.numel() for p in model.parameters()) == params
