"""The output folder of a benchmark: config.json, results.jsonl (one row per run, each fsynced as
it is written, so an interrupt loses at most the run in progress) and atomically written files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..errors import SpecdecError
from ..files import read_json, write_json_atomic

CONFIG = "config.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
# Facts of a config's "environment" (machine.environment) that describe when a run started, not
# what makes its rows comparable: --resume does not compare them. Endpoints' URLs are where the
# servers listened (a restarted server may listen elsewhere); their names and models are compared.
VOLATILE = ("date", "git_commit", "git_dirty", "endpoint_urls")


# What a resumed run may extend rather than repeat: more methods after the stored ones (their
# endpoints' probes and baselines with them). The rows of the added methods are measured later
# than the others; "additions" says when.
EXTENSIBLE = ("methods", "endpoints", "baselines", "additions")


def check_out_dir(out: Path, config: dict, resume: bool) -> None:
    """Refuse a folder whose rows this run must not add to; check that it can be written. A
    resumed run whose methods extend the stored ones (the stored first, in order, the rest
    equal) adds them: config.json then names them, and its "additions" when they were added."""
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if existing and not resume:
        raise SpecdecError(f"--out {out} is not empty: pass --resume to continue the run there, or choose a new folder")
    if existing and CONFIG not in existing:
        raise SpecdecError(f"--out {out} holds files but no {CONFIG}: it is not a specdec bench or sweep folder")
    if existing:
        stored_config, current_config = read_json(out / CONFIG), _as_json(config)
        stored, current = _comparable(stored_config), _comparable(current_config)
        differing = sorted(k for k in {*stored, *current} if stored.get(k) != current.get(k))
        if not _extends(stored_config, current_config):
            differing = sorted({*differing, "methods"})
        if differing:
            raise SpecdecError(
                f"{out / CONFIG} differs from this run in {', '.join(differing)}: resuming would mix "
                f"results that cannot be compared (a resumed run may only add methods after the stored ones); "
                f"use another --out"
            )
    _probe_writable(out)
    if existing and (added := current_config.get("methods", [])[len(stored_config.get("methods", [])):]):
        write_json_atomic(out / CONFIG, _with_additions(stored_config, current_config, added))


def _extends(stored: dict, current: dict) -> bool:
    """Whether `current` is `stored` with methods added after its own (and their endpoints)."""
    contains = lambda key: all(current.get(key, {}).get(k) == v for k, v in (stored.get(key) or {}).items())
    methods = lambda c: set(c.get("environment", {}).get("methods", []))
    before = stored.get("methods", [])  # a sweep's config names none
    return (current.get("methods", [])[:len(before)] == before and contains("endpoints")
            and contains("baselines") and methods(stored) <= methods(current))


def _with_additions(stored: dict, current: dict, added: list[str]) -> dict:
    """The config of the extended run: the current one (a superset) with the stored start's date
    and commit, and the addition recorded."""
    env = current["environment"]
    addition = {"methods": added, **{k: env.get(k) for k in ("date", "git_commit", "git_dirty")}}
    return {**current, "environment": {**env, **{k: stored["environment"][k] for k in VOLATILE
                                                 if k != "endpoint_urls" and k in stored.get("environment", {})}},
            "additions": [*stored.get("additions", []), addition]}


def _comparable(config: dict) -> dict:
    environment = config.get("environment")
    rest = {k: v for k, v in config.items() if k not in EXTENSIBLE}
    if not isinstance(environment, dict):
        return rest
    return {**rest, "environment": {k: v for k, v in environment.items() if k not in (*VOLATILE, "methods")}}


def _as_json(value: dict) -> dict:
    # What config.json would read back as (tuples become lists), for the comparison.
    return json.loads(json.dumps(value))


def _probe_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as e:
        raise SpecdecError(f"cannot write to --out {out}: {e.strerror or e}") from None










def read_rows(out: Path) -> list[dict]:
    """The complete rows of results.jsonl; a last line cut short by a crash is ignored."""
    path = out / RESULTS
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # whatever follows the last newline is unfinished
    try:
        return [json.loads(line) for line in lines if line]
    except ValueError as e:
        raise SpecdecError(f"{path} has a corrupt line ({e}); it was not written by specdec bench") from None


class RowWriter:
    """Appends rows to results.jsonl, each on one line, flushed and fsynced before returning."""

    def __init__(self, out: Path, config: dict):
        out.mkdir(parents=True, exist_ok=True)
        if not (out / CONFIG).exists():
            write_json_atomic(out / CONFIG, _as_json(config))
        self.path = out / RESULTS
        _drop_unfinished_line(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_unfinished_line(path: Path) -> None:
    """Cut a partial last line left by a crash, so the next row starts on a line of its own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as f:
            f.truncate(keep)
