"""The engine's speculation record (decode.stats.GenerationStats): its figures against rounds
counted by hand, pooling, its one serialisation (versioned: bench rows written before it still
load and summarise to the figures stored with them), and no reader of it indexing its counts by
name from a dict."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

import specdec
from specdec.cli import main
from specdec.bench.row import Measured, engine_stats
from specdec.bench.store import read_rows
from specdec.bench.summary import summarize
from specdec.decode.stats import STATS_VERSION, GenerationStats
from specdec.errors import SpecdecError
from specdec.files import read_json

V1 = Path(__file__).parent / "data" / "bench-v1"  # docs/bench/default-vs-llamacpp-zen4/chat as written then
# (proposed, accepted, draft steps) per round: a full accept, a miss at guess 1, a miss at guess 3
# (guess 3 judged, never accepted), a shorter proposal accepted whole, and a last round left no room.
ROUNDS = [(3, 3, 3), (3, 0, 3), (3, 2, 3), (2, 2, 2), (0, 0, 0)]


def recorded(rounds=ROUNDS, new_tokens: int = 13) -> GenerationStats:
    s = GenerationStats()
    for proposed, accepted, steps in rounds:
        s.record_round(proposed, accepted, steps)
    s.times.update(prefill=0.5, propose=0.2, verify=1.0, accept=0.1, other=0.1)
    s.target_calls, s.draft_calls = len(rounds) + 1, sum(steps for _, _, steps in rounds) + 1
    s.finish(new_tokens)
    return s


def test_the_figures_of_hand_counted_rounds():
    s = recorded()
    assert (s.rounds, s.proposed, s.accepted) == (5, 11, 7)
    assert s.drafts == 4 and s.rounds_without_proposal == 1
    # guess 1 judged in the 4 proposing rounds, accepted in 3; guess 2 judged in those 3, accepted
    # in 3; guess 3 judged in the 2 rounds that proposed 3 and accepted 2, accepted in 1
    assert s.position_judged == [4, 3, 2] and s.position_accepted == [3, 3, 1]
    assert s.position_acceptance == [3 / 4, 3 / 3, 1 / 2]
    assert s.acceptance_rate == 7 / 11
    assert s.mean_accepted_length == (7 + 5) / 5
    assert s.accept_length_histogram == [2, 0, 2, 1]  # rounds by accepted guesses 0..3
    assert s.prefill_seconds == 0.5 and s.decode_seconds == pytest.approx(1.4)
    assert s.decode_tokens == 12 and s.tokens_per_s == pytest.approx(12 / 1.4)


def test_a_position_judged_but_never_accepted_counts_zero():
    s = recorded([(2, 0, 2), (2, 1, 2)], new_tokens=4)
    assert s.position_judged == [2, 1] and s.position_accepted == [1]
    assert s.position_acceptance == [1 / 2, 0.0]


def test_an_empty_record_has_zero_figures():
    s = GenerationStats()
    assert (s.acceptance_rate, s.mean_accepted_length, s.tokens_per_s) == (0.0, 0.0, 0.0)
    assert s.position_acceptance == [] and s.accept_length_histogram == [] and s.drafts == 0


def test_pooled_records_count_as_one_record_of_all_their_rounds():
    first, second = recorded(ROUNDS[:2], new_tokens=6), recorded(ROUNDS[2:], new_tokens=8)
    pooled = GenerationStats.pooled([first, second])
    whole = recorded()
    for name in ("rounds", "proposed", "accepted", "accept_lengths", "proposed_lengths", "draft_steps",
                 "position_judged", "position_accepted", "drafts", "acceptance_rate", "mean_accepted_length",
                 "position_acceptance", "accept_length_histogram"):
        assert getattr(pooled, name) == getattr(whole, name), name
    assert pooled.new_tokens == 14 and pooled.decode_tokens == 5 + 7  # each generation's first token is its prefill's
    assert pooled.times["verify"] == 2.0 and pooled.tokens_per_s == pytest.approx(12 / 2.8)
    assert pooled.target_calls == first.target_calls + second.target_calls


def test_to_dict_and_from_dict_round_trip():
    s = recorded()
    data = json.loads(json.dumps(s.to_dict()))
    assert data["version"] == STATS_VERSION
    assert data["mean_accepted_length"] == s.mean_accepted_length and data["tokens_per_s"] == s.tokens_per_s
    assert GenerationStats.from_dict(data) == s
    data["mean_accepted_length"] = 99.0  # a derived figure is recomputed, not read
    assert GenerationStats.from_dict(data).mean_accepted_length == s.mean_accepted_length


def test_a_record_of_a_later_version_is_refused_clearly():
    with pytest.raises(SpecdecError, match="version 3.*newer one"):
        GenerationStats.from_dict({**recorded().to_dict(), "version": 3})


def test_a_bench_row_carries_the_record_whole():
    s = recorded()
    row = json.loads(json.dumps(Measured(list(range(13)), 13, "length", s.prefill_seconds, s.decode_seconds,
                                         s.decode_tokens, dict(s.times), stats=s).fields()))
    assert engine_stats(row) == s and row["tokens_per_s"] == pytest.approx(s.tokens_per_s)
    other = Measured([1, 2], 2, "length", 0.1, 0.2, 1, {}, rounds=1, round_tokens=[1, 1]).fields()
    assert engine_stats(json.loads(json.dumps(other))) is None


def test_rows_of_version_1_load_and_summarise_as_when_they_were_written(tmp_path):
    """A bench folder written before the record was stored whole: its engine rows load into
    records, and `specdec report` summarises them to the acceptance figures and predictions the
    code of that time stored (expected.json: those fields of its summary.json)."""
    rows = read_rows(V1)
    first = next(r for r in rows if r["method"] == "auto")
    s = engine_stats(first)
    assert "stats" not in first and s.rounds == first["rounds"] and s.accept_lengths == first["accept_lengths"]
    assert s.new_tokens == first["n_new"] and s.draft_steps == []  # not recorded in version 1
    assert engine_stats(next(r for r in rows if r["method"] == "llamacpp")) is None

    expected = read_json(V1 / "expected.json")
    summary = summarize(rows, read_json(V1 / "config.json"))
    groups = [(summary["overall"], expected["overall"]),
              *((summary["categories"][c], e) for c, e in expected["categories"].items())]
    for group, wanted in groups:
        for label, fields in wanted.items():
            for name, value in fields.items():
                assert _same(group["methods"][label][name], value), (label, name)

    folder = tmp_path / "old"
    shutil.copytree(V1, folder)
    (folder / "expected.json").unlink()
    assert main(["report", str(folder)]) == 0
    written = json.loads((folder / "summary.json").read_text())
    assert written["overall"]["methods"]["auto"]["mean_accepted_length"] == pytest.approx(
        expected["overall"]["auto"]["mean_accepted_length"])


def _same(got, wanted) -> bool:
    """Equal, floats to 1e-12 relative (sums may run in another order), inside dicts and lists too."""
    if isinstance(wanted, dict):
        return isinstance(got, dict) and got.keys() >= wanted.keys() and all(_same(got[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(got, list) and len(got) == len(wanted) and all(map(_same, got, wanted))
    if isinstance(wanted, float):
        return got == pytest.approx(wanted, rel=1e-12)
    return got == wanted


# --- readers take the record, not its counts by name ----------------------------------------------

# Names only the record has. A dict read by one of them outside the record's own module reads a
# serialised record back by string key; these sites are the exceptions, each for a reason.
RECORD_ONLY = {"accept_lengths", "proposed_lengths", "draft_steps", "position_judged", "position_accepted",
               "target_calls", "draft_calls"}
ALLOWED = {
    ("bench/row.py", "accept_lengths"),  # tells a version 1 row of the engine from others' rows
    ("tune/advice.py", "draft_steps"),  # an advise report's Rounds (cost model), not the record
}


def _keys_read(tree: ast.AST):
    """String keys read from dicts: d["key"] and d.get("key")."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield node.lineno, key.value


def test_no_module_reads_the_record_back_by_string_key():
    source = Path(specdec.__file__).parent
    found = []
    for path in sorted(source.rglob("*.py")):
        name = path.relative_to(source).as_posix()
        if name == "decode/stats.py":
            continue
        for line, key in _keys_read(ast.parse(path.read_text(encoding="utf-8"))):
            if key in RECORD_ONLY and (name, key) not in ALLOWED:
                found.append(f"{name}:{line} reads [{key!r}]")
    assert not found, "read the record (decode.stats.GenerationStats, bench.row.engine_stats) instead: " + \
        "; ".join(found)


def test_the_check_finds_a_read_by_key():
    reads = dict(_keys_read(ast.parse("a = row['draft_calls']\nb = row.get('position_judged', [])\nrow['x'] = 1")))
    assert set(reads.values()) == {"draft_calls", "position_judged"}


def test_generates_summary_line_is_the_records():
    from specdec.cli.generate import summary_line
    from specdec.decode.engine import GenerationResult

    line = summary_line(GenerationResult(list(range(13)), "length", recorded()))
    assert line == ("[specdec] 13 tokens (length), decode 8.57 tok/s, target calls 6; 5 rounds, mean accepted "
                    "length 2.40 (acceptance 64% of 11 proposed), draft calls 12; prefill 0.50s, propose 0.20s, "
                    "verify 1.00s, accept 0.10s")
