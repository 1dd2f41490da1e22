"""Multi-turn conversations for a conversation bench: the user's turns of each conversation, in
order; the assistant's answers are the server's own, so they are not part of the material.

Sources: the records of a dataset with two or more `turns` (MT-Bench's 80 two-turn questions, the
same 80 in Spec-Bench's multi-turn categories, or a JSONL file of that shape), and `code-edit`:
one conversation per real source file of about 150 lines that ships with Python's standard
library (the interpreter that runs the bench holds them): the file
pasted with a question, an edit that repeats it, tests for it, a summary. What a coding
assistant's conversation is: an answer that repeats much of what the history holds."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecdecError
from .datasets import Prompt, Selection, load_prompts, select

CODE_EDIT = "code-edit"
# Modules of 147-167 lines (CPython 3.11), plain Python, each about 1,300-1,800 tokens pasted.
CODE_MODULES = ("colorsys", "sched", "reprlib", "genericpath", "codeop", "_py_abc")
CODE_TURNS = (
    "Here is the Python module `{name}.py`:\n\n```python\n{source}```\n\nExplain briefly what it does.",
    "Add type hints to every function and method signature, and show the whole module again with that change.",
    "Now write pytest tests for the module's public functions.",
    "Summarize the changes we made, in three bullet points.",
)


@dataclass(frozen=True)
class Conversation:
    id: str
    category: str
    turns: tuple[str, ...]  # the user's messages, one per turn


def load_conversations(dataset: str, selection: Selection) -> tuple[list[Conversation], str]:
    """The selected conversations of `dataset` (code-edit, mt-bench, spec-bench or a JSONL file)
    and the sha256 of what they hold (their ids, categories and turns), for the run's config: a
    resumed run must send the same turns."""
    if dataset == CODE_EDIT:
        chosen = select([_as_prompt(c) for c in code_conversations()], selection)
    else:
        prompts, path = load_prompts(dataset, Selection())
        chosen = select([p for p in prompts if len(p.turns) >= 2] or _none_multi_turn(dataset, path), selection)
    conversations = [Conversation(p.id, p.category, p.turns) for p in chosen]
    return conversations, material_sha256(conversations)


def code_conversations() -> list[Conversation]:
    """One four-turn conversation per module of CODE_MODULES."""
    return [Conversation(name, CODE_EDIT, tuple(turn.format(name=name, source=module_source(name))
                                                  for turn in CODE_TURNS)) for name in CODE_MODULES]


def module_source(name: str) -> str:
    """The text of a standard-library module's file (some are frozen into the interpreter: their
    source file is read, not their spec's origin)."""
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py"
    if not path.is_file():
        raise SpecdecError(f"the code-edit conversations paste the standard library's {name}.py, which this Python "
                           "does not have as a source file: use --dataset mt-bench or a JSONL file of turns")
    return path.read_text(encoding="utf-8")


def material_sha256(conversations: list[Conversation]) -> str:
    text = json.dumps([[c.id, c.category, list(c.turns)] for c in conversations])
    return hashlib.sha256(text.encode()).hexdigest()


def _as_prompt(c: Conversation) -> Prompt:
    return Prompt(c.id, c.category, c.turns[0], c.turns)


def _none_multi_turn(dataset: str, path: Path) -> list[Prompt]:
    raise SpecdecError(f"dataset {dataset} ({path}) has no record with two or more turns: a conversation bench "
                       f"needs records with a 'turns' list (mt-bench, spec-bench, or {CODE_EDIT})")
