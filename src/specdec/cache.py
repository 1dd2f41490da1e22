"""KV-cache adapter: the length and trim of a transformers cache, whatever the release.

transformers changed both the forward keyword (`past_key_values` -> `cache`, 5.2x) and the
meaning of `Cache.crop` (absolute length -> number of tokens to remove). A negative argument
means "remove that many" in every 5.x release, and zero means "crop to nothing" in older ones,
so the adapter only ever passes a strictly negative count.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from .errors import SpecdecError


def cache_keyword(model: PreTrainedModel) -> str:
    """The name under which this transformers release passes the cache to `forward`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class KVCache:
    """A model's KV cache seen as a sequence of positions that can be appended and trimmed."""

    def __init__(self, model: PreTrainedModel):
        self.hf_cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self.hf_cache.get_seq_length()

    def layer_lengths(self) -> list[int]:
        """Length of every layer; all equal in a consistent cache."""
        return [layer.get_seq_length() for layer in self.hf_cache.layers]

    def trim(self, length: int) -> None:
        """Keep the first `length` positions and drop the rest."""
        current = self.length
        if not 0 <= length <= current:
            raise ValueError(f"cannot trim a cache of {current} positions to {length}")
        if length < current:
            self.hf_cache.crop(length - current)

    def keep_positions(self, start: int, offsets: Sequence[int]) -> None:
        """Keep the first `start` positions, then the positions start + offsets[j] (increasing
        offsets) moved to start + j; drop the rest. Used after a tree forward to keep only the
        accepted path, whose keys were computed at the positions they now occupy."""
        offsets = list(offsets)
        span = self.length - start
        if offsets != sorted(set(offsets)) or any(not 0 <= o < span for o in offsets):
            raise ValueError(f"offsets {offsets} must increase and lie in [0, {span})")
        for layer in self.hf_cache.layers:
            # A sliding-window or quantized layer keeps more state than keys/values; moving
            # positions inside it would need that layer's own bookkeeping.
            if type(layer) is not DynamicLayer:
                kind = type(layer).__name__
                raise SpecdecError(f"tree verification needs plain dynamic cache layers, not {kind}")
            if not layer.is_initialized:  # a layer that shares another's keys holds none
                continue
            index = torch.tensor(offsets, dtype=torch.long, device=layer.keys.device) + start
            layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys.index_select(2, index)], dim=2)
            layer.values = torch.cat([layer.values[:, :, :start], layer.values.index_select(2, index)], dim=2)
