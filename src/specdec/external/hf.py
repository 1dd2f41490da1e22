"""transformers' own generate(), run the way specdec compares against it: a fresh generation
config (a checkpoint's defaults such as repetition_penalty or top_k=50 would otherwise make it
decode something other than what specdec decodes)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..decode.sampling import SamplingConfig


def generation_config(max_new_tokens: int, eos_ids: Sequence[int], sampling: SamplingConfig,
                      **options) -> GenerationConfig:
    """HF's config for what `sampling` says; `options` (prompt lookup, ...) are added as given."""
    eos = list(eos_ids) or None
    base = dict(
        max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=eos,
        pad_token_id=eos[0] if eos else 0,  # batch of one: never used, but HF warns without it
    )
    if sampling.greedy:
        base.update(do_sample=False)
    else:
        # top_k=0 and top_p=1.0 switch HF's filters off, as None does in specdec.
        base.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0,
                    top_p=sampling.top_p or 1.0)
    return GenerationConfig(**base, **options)


def hf_greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int, eos_ids: Sequence[int]) -> list[int]:
    """transformers' plain greedy decoding of `prompt`: the new token ids."""
    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
    cfg = generation_config(max_new_tokens, eos_ids, SamplingConfig())
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    return out[0, ids.shape[1]:].tolist()
