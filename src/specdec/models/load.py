"""Loading target and draft models: registry names (specdec.registry) or local HF folders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import SpecdecError
from ..machine import native_bf16
from ..registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY, converted_folder, known_models
from ..runtime.hf.model_facts import eos_token_ids, logit_width

if TYPE_CHECKING:  # transformers' model side is imported where a model loads (seconds at start-up)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "DTYPES", "check_same_vocab", "load_model", "random_model", "resolve_dtype"]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """"auto": bfloat16 where the hardware computes it natively (CUDA, CPUs with AVX-512 BF16 or
    AMX), else float32: emulated bf16 matmuls are compute-bound, so a block of 4 tokens costs
    2-3 plain steps, which leaves speculation little to gain (measured in docs/)."""
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):
        return "bfloat16"
    return "bfloat16" if native_bf16() else "float32"


def load_model(
    name_or_path: str, dtype: str = "auto", device: str = "cpu", trust_remote_code: bool = False,
    quant: str = "none", group: int = 32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode on `device` in `dtype` ("auto": see resolve_dtype), and its tokenizer.
    `quant` "int8" or "int4": its linear layers quantized, Q8 or Q4 (specdec.models.quant_cache: a
    registry model from its GGUF, converted once into the model cache; a folder rounded, int4 in
    groups of `group` inputs); norms and attention stay in `dtype`, and the quantized layers read
    and write it (their activations are quantized to int8 inside the kernels)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..runtime.hf.prepare import prefer_gqa_attention
    from .quant_cache import quantize_model, registry_weights
    from .quant_options import check_options

    dtype = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(DTYPES)}")
    check_options(quant, group, device, name_or_path)  # before the slow part
    spec = REGISTRY.get(name_or_path)
    if spec is None and name_or_path.endswith(".gguf"):
        raise SpecdecError(f"{name_or_path} is a GGUF file: it runs on specdec's native runtime, as it is or as an int8 "
                           "or int3 form (--target-quant/--draft-quant int4, int8, int3; not dense, not --runtime hf); "
                           "for transformers' model pass a Hugging Face folder")
    folder = converted_folder(spec) if spec else _local_folder(name_or_path)
    # Converted (or read from the cache) before this model loads: a conversion loads its own
    # dense copy, and two dense copies of the 1.5B target in float32 and bf16 take 9 GB.
    weights = registry_weights(spec, quant) if spec and quant != "none" else None
    # local_files_only: specdec never reaches the Hub; use_safetensors: no pickle is ever unpickled.
    common = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype], use_safetensors=True, **common)
    tokenizer = AutoTokenizer.from_pretrained(folder, **common)
    model = quantize_model(model.to(device).eval(), name_or_path, quant, group, weights)
    prefer_gqa_attention(model)  # before any forward, so HF generate() in a bench runs alike
    return model, tokenizer


def random_model(name_or_path: str, dtype: str = "auto", device: str = "cpu") -> PreTrainedModel:
    """A model of the architecture of `name_or_path` with random weights: timing a forward does
    not depend on the weights' values, so costs can be measured where the weights are absent.
    Registry models' architectures ship with specdec; a folder needs only its config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..runtime.hf.prepare import prefer_gqa_attention

    dtype = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(DTYPES)}")
    spec = REGISTRY.get(name_or_path)
    config_file = (Path(__file__).parents[1] / "data" / "configs" / f"{spec.name}.json" if spec
                   else Path(name_or_path) / "config.json")
    if not config_file.is_file():
        raise SpecdecError(f"{name_or_path} is neither a known name ({', '.join(known_models())}) "
                           "nor a folder with a config.json")
    config = AutoConfig.from_pretrained(config_file)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    model = model.eval()
    prefer_gqa_attention(model)
    return model


def check_name(name_or_path: str) -> None:
    """A one-line error for a model that is neither a registry model, a GGUF file nor a Hugging
    Face folder: what a command checks before anything slow (reading another model's files)."""
    from ..gguf import is_gguf

    if not is_gguf(name_or_path):
        _local_folder(name_or_path)


def _local_folder(path: str) -> Path:
    """`path` as a Hugging Face model folder, or a one-line error saying what to pass instead."""
    folder = Path(path)
    if not folder.is_dir():
        raise SpecdecError(
            f"unknown model {path!r}: not a known name and not a folder; use a Hugging Face model folder "
            f"or one of: {', '.join(known_models())}"
        )
    if not (folder / "config.json").is_file():
        raise SpecdecError(
            f"{path} is not a Hugging Face model folder (no config.json); pass a folder made by save_pretrained"
        )
    if not any(folder.glob("*.safetensors")):
        found = "only pickle weights (.bin)" if any(folder.glob("*.bin")) else "no weights"
        raise SpecdecError(
            f"{path} has {found}; specdec loads safetensors only: re-save it with "
            f"model.save_pretrained(folder) from a trusted environment"
        )
    return folder


def check_same_vocab(
    target_tok: PreTrainedTokenizerBase,
    draft_tok: PreTrainedTokenizerBase,
    target_model,
    draft_model,
) -> None:
    """Raise unless a draft token id means the same token to the target, as speculation needs.

    The two models' logit widths may differ (checkpoints pad the output layer differently), so each
    only has to cover the shared tokenizer's ids. `draft_model` None: only the tokenizers and the
    target are checked (a draft that runs in restricted-head variants only: its width is theirs).
    """
    fix = "use a draft with the target's tokenizer, or --proposer lookup, which needs no draft model"
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise SpecdecError(f"the target and draft tokenizers have different vocabularies; {fix}")
    needed = max(target_tok.get_vocab().values()) + 1
    for role, model in (("target", target_model), ("draft", draft_model)):
        if model is None:
            continue
        width = scored_width(model)
        if width < needed:
            raise SpecdecError(f"the {role} model scores {width} token ids but its tokenizer uses {needed}; {fix}")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a registry model, GGUF file or local folder, without its weights: what a
    bench of endpoints alone needs to send the same prompt ids as specdec's methods. A GGUF's
    comes from its metadata (no dense conversion)."""
    from ..gguf import is_gguf
    from ..gguf import tokenizer_of

    if is_gguf(name_or_path):
        return tokenizer_of(name_or_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_local_folder(name_or_path), trust_remote_code=trust_remote_code,
                                         local_files_only=True)


def scored_width(model) -> int:
    """Token ids a model scores: a transformers model's output layer, or a runtime's vocab_size
    (decode.interface.Runtime, e.g. the native runtime's)."""
    return model.vocab_size if _is_runtime(model) else logit_width(model)


def eos_of(model) -> tuple[int, ...]:
    """End-of-sequence ids of a transformers model or a runtime."""
    return model.eos_token_ids if _is_runtime(model) else eos_token_ids(model)


def _is_runtime(model) -> bool:
    """A decode.interface.Runtime, not a transformers model (a torch module; as
    runtime.choose.runtime_of tells them apart)."""
    return not isinstance(model, torch.nn.Module)
