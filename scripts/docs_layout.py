"""Write docs/layout.md, the source layout, from the tree: the layers (each package of src/specdec
with the packages it imports, importers first) and each package and module with the first
sentence of its docstring (a C++ file: of its leading comment).

    python scripts/docs_layout.py            # rewrite docs/layout.md
    python scripts/docs_layout.py --check    # exit 1 if docs/layout.md is stale

The modules are read with `ast`, never imported, so this runs without the project's dependencies.
tests/test_docs.py fails when the page differs from what this script writes.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "specdec"
PAGE = ROOT / "docs" / "layout.md"
COMMAND = "python scripts/docs_layout.py"
SOURCE_SUFFIXES = (".py", ".cpp")
# Long first sentences are cut here, so a table row stays one readable line.
MAX_SUMMARY = 180

HEADER = f"""# Source layout

The packages and modules of `src/specdec`, each with the first sentence of its docstring.
Generated from the tree by `{COMMAND}`; tests/test_docs.py fails when
this page is stale. To change a description, edit the module's docstring and run the command.
Where a change goes and the order of the layers: [design.md](design.md).
"""


def first_sentence(text: str) -> str:
    """The first sentence of the first paragraph of `text`, on one line, table-safe."""
    paragraph = text.strip().split("\n\n")[0]
    line = " ".join(part.strip() for part in paragraph.splitlines())
    match = re.search(r"\.(\s|$)", line)
    sentence = line[:match.start() + 1] if match else line
    if len(sentence) > MAX_SUMMARY:
        sentence = sentence[:MAX_SUMMARY].rsplit(" ", 1)[0] + " ..."
    return sentence.replace("|", "\\|")


def python_summary(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return first_sentence(docstring) if docstring else "(no docstring)"


def cpp_summary(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return first_sentence("\n".join(lines)) if lines else "(no leading comment)"


def summary(path: Path) -> str:
    return python_summary(path) if path.suffix == ".py" else cpp_summary(path)


def package_summary(path: Path) -> str:
    init = path / "__init__.py"
    return python_summary(init) if init.is_file() else "(no __init__.py)"


def folder_summary(path: Path) -> str:
    """A folder that is not a package (data files): its README's first sentence."""
    readme = path / "README.md"
    if readme.is_file():
        text = "\n".join(line for line in readme.read_text(encoding="utf-8").splitlines()
                         if not line.startswith("#"))
        return "data files: " + first_sentence(text)
    return "data files"


def is_package(path: Path) -> bool:
    """A folder of Python modules (a namespace package too); not one of data files."""
    return any(path.glob("*.py"))


def package_section(path: Path, dotted: str) -> list[str]:
    """One package's heading, its own summary and a table of what it holds."""
    rows = []
    for child in sorted(path.iterdir()):
        if child.name.startswith((".", "__")):
            continue
        if child.is_dir():
            name = f"`{child.name}/`"
            rows.append(f"| {name} | {package_summary(child) if is_package(child) else folder_summary(child)} |")
        elif child.suffix in SOURCE_SUFFIXES:
            rows.append(f"| `{child.name}` | {summary(child)} |")
    return [f"## {dotted}", "", package_summary(path), "", "| module | what |", "|---|---|", *rows, ""]


def packages(path: Path, dotted: str) -> list[tuple[Path, str]]:
    """Every package under `path`, depth first, in name order."""
    found = [(path, dotted)]
    for child in sorted(path.iterdir()):
        if child.is_dir() and is_package(child):
            found += packages(child, f"{dotted}.{child.name}")
    return found


def imported_units(path: Path, package: Path) -> set[str]:
    """The top-level units of `package` (a subpackage, or a module at its top) that `path` imports."""
    parts = path.relative_to(package.parent).with_suffix("").parts  # ("specdec", "decode", "batch")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    here = parts if path.name == "__init__.py" else parts[:-1]  # the module's own package
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(here[:len(here) - node.level + 1]) if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            # `from . import x` names modules: count each, as `import specdec.x` would
            targets = [module + [alias.name] for alias in node.names] if not node.module else [module]
        else:
            continue
        found |= {t[1] for t in targets if len(t) > 1 and t[0] == package.name}
    return found


def unit_of(path: Path, package: Path) -> str:
    return path.relative_to(package).parts[0].removesuffix(".py")


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each top-level unit -> the other units it imports (anywhere in its modules)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        unit = unit_of(path, package)
        if unit == "__init__":  # the public API re-exports from everything below it
            continue
        graph.setdefault(unit, set()).update(imported_units(path, package) - {unit, "__init__"})
    known = set(graph)
    return {unit: targets & known for unit, targets in graph.items()}


def loops(graph: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """Each unit -> the units it shares an import loop with (itself alone where there is none)."""
    reach = {u: set(graph[u]) for u in graph}
    changed = True
    while changed:  # transitive closure: a few dozen units
        changed = False
        for u in graph:
            more = set().union(*(reach[t] for t in reach[u])) - reach[u] if reach[u] else set()
            if more:
                reach[u] |= more
                changed = True
    return {u: frozenset({u} | {t for t in reach[u] if u in reach[t]}) for u in graph}


def layer_order(graph: dict[str, set[str]]) -> list[tuple[str, frozenset[str]]]:
    """Units from the top down: by the longest chain of imports below each (a loop counts as one
    unit), then by name; with each unit its loop."""
    loop = loops(graph)
    height: dict[frozenset[str], int] = {}

    def level(group: frozenset[str]) -> int:
        if group not in height:
            below = {loop[t] for u in group for t in graph[u]} - {group}
            height[group] = 1 + max((level(g) for g in below), default=-1)
        return height[group]

    return [(u, loop[u]) for u in sorted(graph, key=lambda u: (-level(loop[u]), u))]


def layers_section(package: Path) -> list[str]:
    graph = import_graph(package)
    rows = [f"| `{u}` | {', '.join(f'`{t}`' for t in sorted(graph[u])) or '-'} | "
            + (f"loop with {', '.join(sorted(loop - {u}))} |" if len(loop) > 1 else "|")
            for u, loop in layer_order(graph)]
    return ["## Layers", "",
            "Each package or top-level module, every importer above what it imports (lazy imports inside",
            "functions count). A note in the last column means an import loop; with none, no arrow climbs.",
            "", "| unit | imports | |", "|---|---|---|", *rows, ""]


def render(package: Path = PACKAGE) -> str:
    lines = [HEADER, *layers_section(package)]
    for path, dotted in packages(package, package.name):
        lines += package_section(path, dotted)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write docs/layout.md from the source tree")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/layout.md is stale, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"docs/layout.md is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
