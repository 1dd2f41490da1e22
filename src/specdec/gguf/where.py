"""Which GGUF file a --target or --draft names: a registry name (its assembled, hash-checked
file), a path to a .gguf file, or a folder that holds exactly one and no Hugging Face config."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecdecError


def is_gguf(name_or_path: str) -> bool:
    """Whether `name_or_path` names a GGUF model (cheap: nothing is assembled or read)."""
    from ..registry import REGISTRY

    return name_or_path in REGISTRY or _file_in(Path(name_or_path)) is not None


def gguf_path(name_or_path: str) -> Path:
    """The GGUF file `name_or_path` names (a registry model's is assembled first if needed)."""
    from ..registry import REGISTRY, gguf_file

    if name_or_path in REGISTRY:
        return gguf_file(name_or_path)
    found = _file_in(Path(name_or_path))
    if found is None:
        raise SpecdecError(f"{name_or_path} is neither a registry model nor a GGUF file (or a folder holding one)")
    return found


def _file_in(path: Path) -> Path | None:
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecdecError(f"no such GGUF file: {path}")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise SpecdecError(f"{path} holds {len(files)} GGUF files ({', '.join(f.name for f in files[:4])}); "
                           "pass the file itself")
    return files[0] if files else None
