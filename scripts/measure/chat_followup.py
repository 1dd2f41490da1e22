"""A follow-up turn of `specdec chat` (cli.conversation) with the caches kept from the turn before
against the same turn prefilled from nothing (issue 53). Turn 1 pastes a real source file (this
checkout's decode/engine.py) and asks about it; turn 2 asks for a test. Paired: each repetition
runs both sides on the same loaded models, in alternating order, the first repetition discarded
as warm-up; medians. Per side: the target's and the draft's rows forwarded by turn 2's prefill
(counted at each decoder), its time to first token, and its answer, which must be the same on
both sides. Greedy, the default pair as `specdec chat` loads it (--proposer auto).

    flock /tmp/cpu.lock .venv/bin/python scripts/measure/chat_followup.py --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from specdec.cli.conversation import Conversation, Sampling
from specdec.load.loaded import load
from specdec.load.spec import LoadSpec
from specdec.methods.spec import parse

SOURCE = Path(__file__).resolve().parents[2] / "src/specdec/decode/engine.py"
FIRST = f"Explain what this module does, briefly:\n\n```python\n{SOURCE.read_text()}```"
SECOND = "Now write a pytest test that checks generate's reuse_prefix option."


def counted(lm, rows: list[int]) -> None:
    """Append the rows of each of `lm`'s decoder forwards to `rows`."""
    forward = lm.decoder.forward

    def count(r):
        rows.append(r.tokens.numel())
        return forward(r)

    lm.decoder.forward = count


def side(loaded, lm, sampling: Sampling, history: list[dict] | None, rows: dict[str, list[int]]) -> dict:
    """Turn 2 on a fresh Conversation: after turn 1 on the same caches (history None), or with
    turn 1's messages given and nothing cached."""
    talk = Conversation(lm, loaded.tokenizer, loaded.proposer, sampling)
    if history is None:
        talk.say(FIRST)
    else:
        talk.messages = list(history)
    for counts in rows.values():
        counts.clear()
    before_first: dict[str, int] = {}  # each model's forwards before the first token: its prefill's

    def first(tokens: list[int], from_draft: int) -> None:
        before_first.update({name: len(counts) for name, counts in rows.items() if name not in before_first})

    turn = talk.say(SECOND, first)
    return {**{f"{name}_prefill_rows": sum(counts[: before_first[name]]) for name, counts in rows.items()}, "first_token_s": turn.first_token_s, "prompt": turn.prompt_tokens,
            "cached": turn.cached_tokens, "tokens": turn.result.new_tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5, help="paired repetitions after the warm-up one")
    p.add_argument("--new", type=int, default=64, help="max new tokens of each turn")
    args = p.parse_args()
    loaded = load(LoadSpec(method=parse("auto", {})))
    lm, sampling, rows = loaded.lm(), Sampling(args.new), {"target": [], "draft": []}
    counted(lm, rows["target"])
    counted(loaded.proposer.draft_lm, rows["draft"])
    warm = Conversation(lm, loaded.tokenizer, loaded.proposer, sampling)
    warm.say(FIRST)
    history = warm.messages
    runs = {"kept": [], "cold": []}
    for rep in range(args.reps + 1):
        order = ["kept", "cold"] if rep % 2 else ["cold", "kept"]
        for name in order:
            result = side(loaded, lm, sampling, None if name == "kept" else history, rows)
            print(json.dumps({"rep": rep, "side": name, **{k: v for k, v in result.items() if k != "tokens"}}),
                  flush=True)
            if rep:  # the first repetition is the warm-up
                runs[name].append(result)
    answers = {tuple(r["tokens"]) for name in runs for r in runs[name]}
    assert len(answers) == 1, "a follow-up answer differs between the kept and the cold cache"
    summary = {name: {"target_prefill_rows": statistics.median(r["target_prefill_rows"] for r in rs),
                      "draft_prefill_rows": statistics.median(r["draft_prefill_rows"] for r in rs),
                      "first_token_s": statistics.median(r["first_token_s"] for r in rs),
                      "prompt": rs[0]["prompt"], "cached": rs[0]["cached"]} for name, rs in runs.items()}
    print(json.dumps({"cpu": _cpu_model(), "method": loaded.method.label, "reps": args.reps,
                      "load_average": os.getloadavg(), "summary": summary}))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
