"""KV-cache adapter: the length and trim of a transformers cache, whatever the release.

transformers changed both the forward keyword (`past_key_values` -> `cache`, 5.2x) and the
meaning of `Cache.crop` (absolute length -> number of tokens to remove). A negative argument
means "remove that many" in every 5.x release, and zero means "crop to nothing" in older ones,
so the adapter only ever passes a strictly negative count.
"""

from __future__ import annotations

import inspect

from transformers import DynamicCache, PreTrainedModel


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
