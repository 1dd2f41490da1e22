"""Greedy equality of a method's rows with its baseline's (ar, or bench's --baseline endpoint),
prompt by prompt and repeat by repeat, bit for bit; for endpoints with the differences that
bench.endpoint.explain_endpoint_differences filed. Reads only rows."""

from __future__ import annotations

from .agreement import row_key


def greedy_equality(rows: list[dict], baseline: list[dict], differences: dict | None = None) -> dict:
    """Prompts whose output differs from the baseline's in any repeat; with `differences`
    (endpoints: bench.endpoint.explain_endpoint_differences) each difference's gap."""
    base = {(r["prompt_id"], r["repeat"]): r for r in baseline}
    pairs = [(r, same_output(r, base[key])) for r in rows if (key := (r["prompt_id"], r["repeat"])) in base]
    mismatching = list(dict.fromkeys(r["prompt_id"] for r, equal in pairs if not equal))
    explained = [{"prompt": r["prompt_id"], "repeat": r["repeat"], **differences[row_key(r)]}
                 for r, equal in pairs if not equal and differences and row_key(r) in differences]
    return {
        "prompts_compared": len({r["prompt_id"] for r, _ in pairs}),
        "mismatches": len(mismatching),
        "mismatching_prompts": mismatching,
        **({"differences": explained} if explained else {}),
    }


def same_output(row: dict, other: dict) -> bool:
    """Token ids where both rows have them, else the texts (an endpoint that names no ids)."""
    if row["new_tokens"] is not None and other["new_tokens"] is not None:
        return row["new_tokens"] == other["new_tokens"]
    return row.get("text") == other.get("text")
