"""The documentation stays a set of short pages whose links, figures and layout match the tree:
every relative link and anchor in README.md and docs/ resolves, every docs/ path that
README.md and docs/results.md name exists, no page is over 400 lines, docs/ stays under its size
and file budgets and holds no logs, patches or unshown PNGs, and docs/layout.md is what
scripts/docs_layout.py writes from the source tree."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# The pages whose figures must each name a folder or file in the tree.
FIGURE_PAGES = [ROOT / "README.md", DOCS / "results.md"]
MAX_PAGE_LINES = 400
MAX_DOCS_BYTES = 8_000_000
MAX_DOCS_FILES = 300

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A docs/ path as prose or a table names it; one after "COMMIT:" is read from git history, and
# commands in code blocks may name a prefix their script completes, so neither is checked.
DOCS_PATH = re.compile(r"(?<![\w/.:-])docs/[\w./-]*[\w/]")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(CODE_BLOCK.sub("", page.read_text(encoding="utf-8")))]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel(dest)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    assert broken_links(page) == [], f"{rel(page)}: broken links"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md#a-heading) [gone](missing/folder) [bad anchor](there.md#nope) "
                    "[web](https://example.com)\n```\n[in code](not/checked)\n```\n")
    found = broken_links(page)
    assert len(found) == 2
    assert found[0] == "missing/folder (no such file)"
    assert found[1].startswith("there.md#nope (no heading #nope")


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=rel)
def test_every_docs_path_named_exists(page):
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    missing = sorted({p for p in DOCS_PATH.findall(text) if not (ROOT / p).exists()})
    assert missing == [], f"{rel(page)} names docs/ paths that are not in the tree"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_pages_are_short(page):
    lines = len(page.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_PAGE_LINES, f"{rel(page)} has {lines} lines: split it by topic (at most {MAX_PAGE_LINES})"


def test_docs_within_budget():
    files = [p for p in DOCS.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert len(files) < MAX_DOCS_FILES, f"docs/ holds {len(files)} files (budget {MAX_DOCS_FILES})"
    assert size < MAX_DOCS_BYTES, f"docs/ holds {size:,} bytes (budget {MAX_DOCS_BYTES:,})"


def test_docs_hold_no_logs_patches_or_unshown_pictures():
    files = [p for p in DOCS.rglob("*") if p.is_file()]
    assert [rel(p) for p in files if p.suffix in (".log", ".patch")] == [], "keep logs and patches in git history"
    shown = {(page.parent / t.partition("#")[0]).resolve() for page in PAGES for t in links(page)}
    unshown = [rel(p) for p in files if p.suffix == ".png" and p.resolve() not in shown]
    assert unshown == [], "PNGs no page links: remove them (git keeps them)"


def test_layout_page_is_current():
    spec = importlib.util.spec_from_file_location("docs_layout", ROOT / "scripts" / "docs_layout.py")
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    page = DOCS / "layout.md"
    assert page.is_file() and page.read_text(encoding="utf-8") == layout.render(), (
        f"docs/layout.md is stale: run `{layout.COMMAND}`")
