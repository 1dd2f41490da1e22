"""Greedy outputs of a bench run against transformers' generate (`hf-ar`), differences explained.

specdec's own methods are compared with `ar` bit for bit (equality.greedy_equality). Against
hf-ar, transformers' plain decoding on an unmodified copy of the target, kernels differ, so an
output may part from it where the target's top two logits (nearly) tie. After the runs, each
row that differs from hf-ar's row on the same prompt and repeat gets its first difference and the
target's top-1/top-2 gap there (conformance.first_difference), kept in differences.json so a
resumed run and `specdec report` find them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..files import read_json, write_json_atomic
from ..methods.spec import parse
from .store import read_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

REFERENCE = "hf-ar"
DIFFERENCES = "differences.json"


def explain_differences(out: Path, target: PreTrainedModel, prompt_ids: dict[str, list[int]]) -> dict:
    """Add the first difference of every row that differs from hf-ar's to out/differences.json
    (rows explained before are kept); returns the file's content."""
    from ..conform.ties import first_difference  # torch: the summary side reads this module without it

    path = out / DIFFERENCES
    known = read_json(path) if path.is_file() else {}
    rows = read_rows(out)
    reference = {(r["prompt_id"], r["repeat"]): r["new_tokens"] for r in rows if r["method"] == REFERENCE}
    for r in rows:
        ref = reference.get((r["prompt_id"], r["repeat"]))
        key = row_key(r)
        if ref is None or r["method"] == REFERENCE or key in known or r["new_tokens"] == ref \
                or parse(r["method"]).is_endpoint:  # a server's kernels and weights: not held to hf-ar
            continue
        diff = first_difference(target, prompt_ids[r["prompt_id"]], ref, r["new_tokens"])
        known[key] = {"position": diff.position, "reference_token": diff.expected, "token": diff.got,
                      "gap": diff.gap, "tolerance": diff.tolerance, "kind": diff.kind}
    if known:
        write_json_atomic(path, known)
    return known


def read_differences(out: Path) -> dict:
    path = out / DIFFERENCES
    return read_json(path) if path.is_file() else {}


def agreement(rows: list[dict], reference: list[dict], differences: dict) -> dict:
    """Per method: prompts compared with hf-ar, how many equal in every repeat, and each
    difference with its gap; `unexplained` counts those that are not (near-)ties. A difference
    not yet explained (the run was cut before the post-pass) counts as unexplained."""
    ref = {(r["prompt_id"], r["repeat"]): r["new_tokens"] for r in reference}
    pairs = [(r, r["new_tokens"] == ref[key]) for r in rows if (key := (r["prompt_id"], r["repeat"])) in ref]
    differing = [r for r, equal in pairs if not equal]
    listed = [{"prompt": r["prompt_id"], "repeat": r["repeat"], **differences.get(row_key(r), {"kind": "unexplained"})}
              for r in differing]
    prompts = {r["prompt_id"] for r, _ in pairs}
    return {
        "reference": REFERENCE,
        "prompts_compared": len(prompts),
        "prompts_equal": len(prompts - {r["prompt_id"] for r in differing}),
        "differences": listed,
        "unexplained": sum(d["kind"] in ("not a tie", "unexplained") for d in listed),
    }


def row_key(row: dict) -> str:
    return f"{row['method']}|{row['prompt_id']}|{row['repeat']}"
