"""summary.json -> report.md with tables and PNG plots. Reads only the summary dict, so a report
can be rebuilt anywhere from a copied summary."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecdecError
from ..files import read_json, write_json_atomic, write_text_atomic
from ..fmt import ms, num, pct, table
from .agreement import read_differences
from .plots import PLOTS, save_plot
from .store import CONFIG, RESULTS, SUMMARY, read_rows
from .summary import endpoint_baselines, summarize

REPORT = "report.md"
ROUGH_BELOW = 10  # prompts: with fewer, resamples take few distinct values and the interval means little


def report_folder(out: Path) -> dict:
    """summary.json (written atomically) and report.md from the folder's rows; returns the summary."""
    rows = read_rows(out)
    if not rows:
        raise SpecdecError(f"{out / RESULTS} has no finished rows yet: nothing to summarise")
    summary = summarize(rows, read_json(out / CONFIG), read_differences(out))
    write_json_atomic(out / SUMMARY, summary)
    write_report(summary, out)
    return summary


def write_report(summary: dict, out: Path) -> Path:
    """Write report.md and its plots into `out`; return the report's path."""
    made = [name for name, plot in PLOTS.items() if save_plot(plot, summary, out / name)]
    path = out / REPORT
    write_text_atomic(path, render_markdown(summary, made))
    return path


def render_markdown(summary: dict, plots: list[str]) -> str:
    lines = ["# specdec bench report", "", *_header(summary["config"]), ""]
    lines += _table("Overall", summary["overall"])
    if len(summary["categories"]) > 1:
        for name, group in summary["categories"].items():
            lines += _table(f"Category: {name}", group)
    lines += _load_table(summary["config"], summary["overall"])
    lines += _prediction_table(summary["overall"])
    lines += _equality_section(summary["overall"])
    lines += ["## Plots", ""] + [f"![{name[:-4]}]({name})" for name in plots] + [""]
    lines += ["## How each figure is measured", ""]
    lines += [f"- **{key}**: {text}." for key, text in summary["notes"].items()]
    return "\n".join(lines) + "\n"


def _header(config: dict) -> list[str]:
    s = config["sampling"]
    sampling = "greedy" if s["temperature"] == 0 else (
        f"sampling: temperature {s['temperature']}, top_k {s['top_k']}, top_p {s['top_p']}, seed {s['seed']}"
    )
    sel = config["selection"]
    chosen = ", ".join(f"{k} {v}" for k, v in sel.items() if v is not None) or "all prompts"
    env = config["environment"]
    return [
        f"- target **{config['target']}**" + (f", draft **{config['draft']}**" if config.get("draft") else "")
        + (" (int8 linear layers for every draft method)" if config.get("draft_int8") else "")
        + (f" (head of {config['draft_vocab']} token ids for every draft method)" if config.get("draft_vocab") else ""),
        f"- {config['dtype']} on {config['device']} ({env['device_name']}, {env['threads']} threads); "
        f"torch {env['torch']}, transformers {env['transformers']}",
        *_provenance(env),
        f"- dataset **{config['dataset']['name']}** ({chosen}; {len(config['prompt_ids'])} prompts), "
        f"{'raw prompts' if config['raw'] else 'chat template applied where the tokenizer has one'}",
        f"- up to {config['max_new_tokens']} new tokens, {sampling}, {config['repeats']} repeat(s), "
        f"methods interleaved per prompt after one warm-up generation each",
        f"- peak memory: {config['memory']['meaning']}",
        *_endpoints(config),
        *[f"- added on --resume, started {a['date']} at commit {(a['git_commit'] or 'unknown')[:12]}: "
          + ", ".join(f"`{m}`" for m in a["methods"]) + " (their rows measured after the others')"
          for a in config.get("additions", [])],
    ]


PROMPT_FORMS = {"ids": "token ids", "text": "text (the server takes no token ids: the ids' own text, template "
                "included, which the server tokenizes itself)", "message": "a chat message (the server's template)"}


def _endpoints(config: dict) -> list[str]:
    """Each endpoint's model, the form its prompts were sent in (a run from before the probe
    asked: ids) and what its speedup and equality are measured against."""
    baselines = endpoint_baselines(config)
    return [f"- endpoint **{name}**: model {e['model']}, prompts sent as {PROMPT_FORMS[e.get('prompt_form', 'ids')]}"
            + ("; acceptance from vLLM's /metrics" if e["vllm_metrics"] else "") + _compared(name, baselines)
            for name, e in config.get("endpoints", {}).items()]


def _compared(name: str, baselines: dict[str, str]) -> str:
    base = baselines.get(f"endpoint:name={name}", "ar").removeprefix("endpoint:name=")
    return "; the baseline of its engine" if base == name else f"; compared with **{base}**"


def _provenance(env: dict) -> list[str]:
    """Where and when the run started (configs written since machine.environment record it)."""
    if "date" not in env:
        return []
    commit = (env["git_commit"] or "unknown")[:12] + (" with uncommitted changes" if env["git_dirty"] else "")
    return [f"- started {env['date']} at commit {commit}; bf16 {'native' if env['native_bf16'] else 'emulated'} "
            f"on this CPU ({', '.join(f for f, on in env['cpu_flags'].items() if on) or 'no listed flags'})"]


TABLE_HEAD = ["method", "tok/s median [q1, q3]", "speedup median [95% CI]", "geomean [95% CI]",
              "mean accepted length", "acceptance", "predicted (error)", "prefill s (TTFT)", "peak MiB"]
PREDICTION_HEAD = ["method", "C_T(1)", "C_D", "C_V(k)", "mean block", "C_O", "ar overhead", "rates",
                   "E[tokens/round]", "predicted", "measured", "error"]


def _table(title: str, group: dict) -> list[str]:
    lines = [f"## {title} ({group['n_prompts']} prompts)", ""]
    if group["n_prompts"] < ROUGH_BELOW:
        lines += [f"Fewer than {ROUGH_BELOW} prompts: the bootstrap intervals are rough.", ""]
    rows = [[
        f"`{label}`", _quartiles(m["tokens_per_s"]), _interval(m["speedup"], "median", "ci95_median"),
        _interval(m["speedup"], "geomean", "ci95_geomean"), num(m["mean_accepted_length"]), pct(m["acceptance_rate"]),
        _predicted(m["prediction"]), num(m["prefill_s"]["median"]), _mib(m["peak_memory_bytes"]),
    ] for label, m in group["methods"].items()]
    return lines + table(TABLE_HEAD, rows) + [""]


def _load_table(config: dict, group: dict) -> list[str]:
    """Endpoints: each request's decode rate beside what the server delivered in all, and the
    time to first token's median and tail, at the run's concurrency."""
    n = config.get("concurrency", 1)
    rows = [[f"`{label}`", _quartiles(m["tokens_per_s"]), _quartiles(m["aggregate_tokens_per_s"]),
             _quartiles(m.get("aggregate_decode_tokens_per_s")), *_p50_p99(m.get("ttft_s")),
             *_p50_p99(m.get("stall_s"))]
            for label, m in group["methods"].items() if m.get("aggregate_tokens_per_s")]
    if not rows:
        return []
    gap = config.get("arrival_gap_s")
    sent = f"sent with exponential gaps of mean {gap:g} s" if gap else "at once"
    title = f"## Under load: {n} requests {sent} (overall)" if n > 1 else "## Endpoints, one request at a time (overall)"
    return [title, ""] + table(
        ["endpoint", "decode tok/s per request [q1, q3]", "in all tok/s per wave [q1, q3]",
         "in all decode tok/s per wave [q1, q3]", "TTFT s p50", "TTFT s p99", "longest stall s p50",
         "longest stall s p99"], rows) + [""]


def _p50_p99(t: dict | None) -> list[str]:
    return ["-", "-"] if t is None else [num(t["p50"]), num(t["p99"])]


def _prediction_table(group: dict) -> list[str]:
    preds = {label: m["prediction"] for label, m in group["methods"].items() if m["prediction"]}
    if not preds:
        return []
    rows = [_prediction_row(label, p, p["inputs"]) for label, p in preds.items()]
    return ["## Cost model inputs (overall, milliseconds)", ""] + table(PREDICTION_HEAD, rows) + [""]


def _prediction_row(label: str, p: dict, i: dict) -> list[str]:
    return [f"`{label}`", ms(i["c_target"]), ms(i["c_draft"]), ms(i["c_verify"]), num(i["mean_block_size"]),
            ms(i["c_overhead"]), ms(i["c_baseline_overhead"]), ", ".join(f"{r:.2f}" for r in i["rates"]),
            num(i["expected_tokens_per_round"]), num(p["predicted_speedup"]), num(p["measured_speedup"]),
            f"{100 * p['relative_error']:+.1f}%"]


def _equality_section(group: dict) -> list[str]:
    checks = {label: m["greedy_equal"] for label, m in group["methods"].items() if m["greedy_equal"]}
    lines = []
    if checks:
        lines += ["## Greedy output equal to the baseline (ar; an endpoint: its --baseline endpoint), bit for bit", ""]
        for label, c in checks.items():
            verdict = "all equal" if not c["mismatches"] else (
                f"**{c['mismatches']} differ**: {', '.join(map(str, c['mismatching_prompts']))}"
            ) + "".join(f"; {d['prompt']}: token {d['position']}, gap {d['gap']:.3g}, {d['kind']}" if d["gap"] is not None
                        else f"; {d['prompt']}: {d['kind']}" for d in c.get("differences", []))
            lines.append(f"- `{label}`: {c['prompts_compared']} prompts compared, {verdict}")
        lines.append("")
    agreements = {label: m["hf_agreement"] for label, m in group["methods"].items() if m.get("hf_agreement")}
    if agreements:
        lines += ["## Greedy output against transformers' generate (hf-ar), differences explained", ""]
        for label, a in agreements.items():
            found = "; ".join(f"{d['prompt']} (repeat {d['repeat']}): " + (
                f"token {d['position']}, gap {d['gap']:.3g}, {d['kind']}" if "gap" in d else d["kind"])
                for d in a["differences"])
            verdict = f"{a['prompts_equal']}/{a['prompts_compared']} prompts equal" + (f"; {found}" if found else "")
            lines.append(f"- `{label}`: {verdict}" + (f" (**{a['unexplained']} not ties**)" if a["unexplained"] else ""))
        lines.append("")
    return lines


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"  # an endpoint's memory is the server's


def _quartiles(q: dict | None) -> str:
    return "-" if q is None else f"{q['median']:.2f} [{q['q1']:.2f}, {q['q3']:.2f}]"


def _interval(s: dict | None, centre: str, ci: str) -> str:
    return "-" if s is None else f"{s[centre]:.2f} [{s[ci][0]:.2f}, {s[ci][1]:.2f}]"


def _predicted(p: dict | None) -> str:
    return "-" if p is None else f"{p['predicted_speedup']:.2f} ({100 * p['relative_error']:+.1f}%)"
