"""The small interface through which the engine reaches a model: forward a block over the
cache, read its logits rows, trim, length. Another runtime only has to provide these."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .cache import KVCache, cache_keyword
from .errors import SpecdecError


class CausalLM:
    """A causal LM together with one KV cache holding a prefix of the sequence."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.device = model.device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._cache_kw = cache_keyword(model)
        self.cache = KVCache(model)
        self.calls = 0

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache = KVCache(self.model)
        self.calls = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append `tokens` (1-D) at the cache's next positions; return float32 logits rows
        [len(tokens), vocab], or only the last row's [1, vocab] when `last_only`."""
        start = self.cache.length
        positions = torch.arange(start, start + tokens.numel(), device=self.device)
        out = self.model(
            input_ids=tokens.view(1, -1),
            position_ids=positions.view(1, -1),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            **{self._cache_kw: self.cache.hf_cache},
        )
        self.calls += 1
        logits = out.logits[0].float()
        if not torch.isfinite(logits).all():
            bad = int((~torch.isfinite(logits)).any(-1).nonzero()[0])
            where = start + (tokens.numel() - 1 if last_only else bad)
            raise SpecdecError(
                f"the model produced NaN/inf logits at sequence position {where}; "
                "try --dtype float32 or check the model weights"
            )
        return logits
