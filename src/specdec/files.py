"""The model cache folder and how every writer puts files into it or anywhere else: whole or
not at all. A file is written under a temporary name in its final folder and renamed into place;
a folder is filled under a temporary name and renamed when complete; temporaries of runs killed
outright are removed by the next run."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from .errors import SpecdecError

TMP_PREFIX = ".tmp-"  # temporaries in the cache: .tmp-<pid>-<random>[suffix]
COMPLETE_MARKER = "specdec-complete.json"  # a cache folder's key, written last
WEIGHTS = "weights.safetensors"  # the one file of a cached() folder
T = TypeVar("T")


def cache_root() -> Path:
    """specdec's model cache: converted models, quantized weights, kernels, saved advice."""
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec")


def ensure_writable(folder: Path) -> None:
    """Create `folder` if needed and check that a file can be written there."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # unique per call: two threads of one process share its pid, and one removed the other's probe
        probe = folder / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-probe"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise SpecdecError(f"cannot write to the model cache folder {folder} ({err.strerror or err}); "
                           "set SPECDEC_CACHE to a writable folder") from err


def remove_stale_temps(folder: Path) -> None:
    """Delete temporaries of runs that were killed outright (no chance to clean up); live runs
    keep theirs."""
    for path in folder.glob(f"{TMP_PREFIX}*"):
        match = re.match(rf"{re.escape(TMP_PREFIX)}(\d+)-", path.name)
        if match and not _pid_alive(int(match.group(1))):
            remove(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


@contextmanager
def exclusive(folder: Path, name: str) -> Iterator[None]:
    """Hold `folder`'s lock called `name` against every other process (test workers, parallel
    runs): one of them builds a cache entry while the others wait and then find it built. The
    kernel drops the lock when its holder ends, however it ends. Not reentrant: a process that
    holds a lock must not take the same one again."""
    ensure_writable(folder)
    with open(folder / f".lock-{name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def scratch(folder: Path, suffix: str) -> Iterator[Path]:
    """A temporary name in `folder`, removed on exit unless the caller has renamed it into place."""
    path = folder / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}"
    try:
        yield path
    finally:
        remove(path)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecdecError(f"cannot read {path}: {e}") from None


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write` fill a temporary file in the same folder, fsync it and rename it over `path`:
    readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, value: dict) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(value, indent=1), encoding="utf-8"))


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def cached(folder: Path, key: dict, make: Callable[[], T], write: Callable[[T, Path, dict], None],
           read: Callable[[Path], T]) -> T:
    """What `folder` holds if its marker matches `key`, else make(), saved there first (under a
    temporary name, renamed into place when complete). `write(value, file, key)` and
    `read(file)`: how the value goes to and from its one file (WEIGHTS)."""
    if is_complete(folder, key):
        return _read_saved(folder, read)
    root = folder.parent
    with exclusive(root, folder.name):  # one process converts, the others wait and read its folder
        if is_complete(folder, key):  # another process made it while this one waited
            return _read_saved(folder, read)
        remove_stale_temps(root)
        if folder.exists():
            print(f"specdec: {folder} is incomplete or from another source or version; converting again",
                  file=sys.stderr)
        value = make()
        with scratch(root, "") as tmp:
            tmp.mkdir()
            write(value, tmp / WEIGHTS, key)
            marker = {**key, "weights_bytes": (tmp / WEIGHTS).stat().st_size}
            (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1))
            remove(folder)
            os.replace(tmp, folder)
    return value


def _read_saved(folder: Path, read: Callable[[Path], T]) -> T:
    try:
        return read(folder / WEIGHTS)
    except Exception as err:  # safetensors raises its own error types for a damaged file
        raise SpecdecError(f"the cached weights in {folder} are corrupt ({err}); delete that folder and "
                           "they are converted again") from err


def is_complete(folder: Path, key: dict) -> bool:
    """Whether `folder` holds a finished conversion for `key` (its marker, and a weights file
    of the recorded size)."""
    try:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
        size = (folder / WEIGHTS).stat().st_size
    except (OSError, ValueError):
        return False
    return {name: marker.get(name) for name in key} == key and marker.get("weights_bytes") == size
