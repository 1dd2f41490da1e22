"""Numbers as the reports print them (bench's report.md, advise's text, sweep's table)."""

from __future__ import annotations


def num(x: float | None) -> str:
    """Two decimals, "-" for a missing value."""
    return "-" if x is None else f"{x:.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return [_cells(head), "|" + "---|" * len(head), *map(_cells, rows)]


def _cells(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
