"""`specdec serve` started in the test process on 127.0.0.1 (any free port), and what the server
tests read from it: the openai client, /metrics by name.

start_native serves specdec's own runtime (what users run): tiny GGUF files written here
(tests/gguf_files.py: random weights, SmolLM2's byte-level BPE tokenizer cut to 2048 tokens and
its chat template), a two-layer qwen2 target and a one-layer draft drawn from the same seed (it
shares the target's first layer, so some guesses are accepted), greedy, draft:k=3. launch serves
any command line (tests/test_serve.py keeps `--runtime hf` folders where that runtime is the
point)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from gguf_files import T, write_model
from prometheus_client.parser import text_string_to_metric_families

from specdec.cli import build_parser

METHOD = "draft:k=3"
CONTEXT = 2048  # the tiny files' context length (gguf_files.write_model)


@dataclass
class Running:
    url: str
    name: str
    worker: object
    server: object

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def metrics(self) -> dict:
        """Every sample of /metrics, by name (and the label values but model_name)."""
        text = httpx.get(f"{self.url}/metrics").text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(v for k, v in sorted(s.labels.items()) if k != "model_name")
                out[(s.name, *labels)] = s.value
        return out


def gguf_pair(folder: Path, **files) -> tuple[str, str]:
    """The target and draft files in `folder` (written the first time; `files`: write_model's
    options for both, such as another chat template or token list)."""
    target, draft = folder / "target.gguf", folder / "draft.gguf"
    if not target.exists():
        write_model(target, "qwen2", T.Q8_0, seed=1, **files)
        write_model(draft, "qwen2", T.Q8_0, seed=1, layers=1, **files)
    return str(target), str(draft)


@contextmanager
def model_cache(folder: Path):
    """specdec's model cache under `folder` while the block runs (where a GGUF's prepared parts go)."""
    from specdec.gguf import store

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "cache_root", lambda: Path(folder) / "cache")
        yield


def tiny_models(folder: Path, **files):
    """(target, draft, tokenizer) of the tiny GGUF pair in `folder`, in this process on the
    native runtime."""
    from specdec.gguf import tokenizer_of
    from specdec.runtime import load_gguf

    target, draft = gguf_pair(folder, **files)
    with model_cache(folder):
        return load_gguf(target), load_gguf(draft), tokenizer_of(target)


def native_args(folder: Path, *extra: str, **files) -> list[str]:
    """`specdec serve`'s model flags for the tiny GGUF pair in `folder`."""
    target, draft = gguf_pair(folder, **files)
    return ["--target", target, "--draft", draft, "--runtime", "native", "--proposer", METHOD, *extra]


def start_native(where, *extra: str, **files) -> Running:
    """A server of the tiny GGUF pair; `where` is a folder or pytest's tmp_path_factory (its
    files then go to a fresh folder). The GGUF's prepared parts are cached under that folder;
    `files` are write_model's options for both files (gguf_pair)."""
    folder = where.mktemp("serve-gguf") if hasattr(where, "mktemp") else Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    with model_cache(folder):  # only while the server loads
        return launch(native_args(folder, *extra, **files))


def launch(argv: list[str]) -> Running:
    """`specdec serve` with these model flags (and any others), once its /health answers 200."""
    from specdec.cli.serve import build_server
    from specdec.serve.server import bound_socket

    args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "warning", *argv])
    server, worker = build_server(args)
    sock = bound_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    worker.start()
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker.state != "failed":
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return Running(url, args.served_model_name or args.target, worker, server)
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    stop(Running(url, args.target, worker, server))
    raise AssertionError(f"the server did not get ready: {worker.state} {worker.load_error}")


def stop(running: Running) -> None:
    running.server.should_exit = True
    running.worker.stop()
    running.worker.join(10)


def target_alone(folder: Path):
    """The served target file in this process, in the form the server runs it (int4: the file's
    blocks as they are), and its tokenizer: what the server's greedy texts must equal."""
    target, _, tokenizer = tiny_models(folder)
    return target, tokenizer
