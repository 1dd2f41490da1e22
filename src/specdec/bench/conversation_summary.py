"""The summary of a conversation bench, from its rows only (bench.conversation): per server the
medians of each turn (time to first token, decode tokens/s, prompt and cached tokens), of the
first turn and of the follow-up turns, of the conversations' wall time; and against every other
server, per conversation paired ratios (the other's over the server's: above 1 the server is
faster) with their median and bootstrap interval, and how many conversations got the other's
answers word for word (a server with and without its prefix cache: all of them)."""

from __future__ import annotations

import numpy as np

from .summary import geomean, quartiles, speedup_summary

TURN_FIELDS = ("ttft_s", "decode_tokens_per_s", "prompt_tokens", "cached_tokens", "completion_tokens", "wall_s")


def summarize_conversations(rows: list[dict], config: dict) -> dict:
    """{"servers": {name: summary}}, each server's "vs" every other server that has rows, and its
    "baseline" where config names one (config["baselines"]: server -> baseline server)."""
    by_server: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_server.setdefault(r["server"], {})[r["conversation"]] = r
    baselines = config.get("baselines") or {}
    names = [name for name in config["methods"] if by_server.get(name)]
    out = {}
    for name in names:
        out[name] = server_summary(list(by_server[name].values()))
        out[name]["baseline"] = baselines.get(name) if baselines.get(name) in names else None
        out[name]["vs"] = {other: paired(by_server[name], by_server[other]) for other in names if other != name}
    return {"servers": out, "max_tokens": config.get("max_tokens"), "concurrency": config.get("concurrency")}


def server_summary(rows: list[dict]) -> dict:
    depth = max(len(r["turns"]) for r in rows)
    return {
        "conversations": len(rows),
        "wall_s": quartiles([r["wall_s"] for r in rows]),
        "first_turn": turn_summary([r["turns"][0] for r in rows]),
        "follow_up_turns": turn_summary([t for r in rows for t in r["turns"][1:]]),
        "per_turn": [turn_summary([r["turns"][i] for r in rows if len(r["turns"]) > i]) for i in range(depth)],
    }


def turn_summary(turns: list[dict]) -> dict | None:
    """Quartiles of each of TURN_FIELDS over `turns` (those that have it)."""
    if not turns:
        return None
    return {"turns": len(turns), **{f: quartiles([t[f] for t in turns if t.get(f) is not None]) for f in TURN_FIELDS}}


def paired(mine: dict[str, dict], base: dict[str, dict]) -> dict:
    """Ratios per conversation both servers finished: wall time, the follow-up turns' time to first
    token and decode tokens/s (geometric mean over the conversation's follow-up turns), each the
    baseline's over the server's (decode: the server's over the baseline's), so above 1 is faster."""
    common = [c for c in mine if c in base]
    wall = {c: base[c]["wall_s"] / mine[c]["wall_s"] for c in common}
    ttft = {c: r for c in common if (r := _follow_up_ratio(base[c], mine[c], "ttft_s")) is not None}
    decode = {c: 1 / r for c in common if (r := _follow_up_ratio(base[c], mine[c], "decode_tokens_per_s"))}
    same = sum(all(a["text"] == b["text"] for a, b in zip(mine[c]["turns"], base[c]["turns"]))
               and len(mine[c]["turns"]) == len(base[c]["turns"]) for c in common)
    return {"conversations": len(common), "wall_speedup": speedup_summary(wall),
            "follow_up_ttft_speedup": speedup_summary(ttft), "follow_up_decode_speedup": speedup_summary(decode),
            "same_answers": same}


def _follow_up_ratio(base: dict, mine: dict, field: str) -> float | None:
    """Geometric mean over the follow-up turns of base's `field` over mine's (None: no turn has
    both)."""
    ratios = [b[field] / m[field] for b, m in zip(base["turns"][1:], mine["turns"][1:])
              if b.get(field) and m.get(field)]
    return geomean(np.array(ratios)) if ratios else None


def digest(summary: dict) -> str:
    """A few lines for the terminal: per server the medians that matter, and its paired ratios."""
    lines = []
    for name, s in summary["servers"].items():
        follow = s["follow_up_turns"] or {}
        med = lambda q: q["median"] if q else float("nan")
        line = (f"  {name:<18} wall {med(s['wall_s']):7.1f} s, turn 1 TTFT {med(s['first_turn']['ttft_s']):6.2f} s, "
                f"follow-up TTFT {med(follow.get('ttft_s')):6.2f} s, decode "
                f"{med(follow.get('decode_tokens_per_s')):6.1f} tok/s, cached {med(follow.get('cached_tokens')):6.0f}")
        vs = s["vs"].get(s["baseline"]) if s["baseline"] and s["baseline"] != name else None
        if vs and vs["wall_speedup"]:
            line += f"; vs {s['baseline']}: wall {vs['wall_speedup']['median']:.2f}x"
            if vs["follow_up_ttft_speedup"]:
                line += f", follow-up TTFT {vs['follow_up_ttft_speedup']['median']:.2f}x"
            line += f", same answers {vs['same_answers']}/{vs['conversations']}"
        lines.append(line)
    return "\n".join(lines)
