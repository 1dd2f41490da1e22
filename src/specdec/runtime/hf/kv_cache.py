"""KV-cache adapter: the length and trim of a transformers cache, whatever the release, and a
preallocated layout for its layers.

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

from ...errors import SpecdecError


def cache_keyword(model: PreTrainedModel) -> str:
    """The name under which this transformers release passes the cache to `forward`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live at the front of buffers allocated ahead.

    transformers' DynamicLayer appends by torch.cat, which copies the layer's whole cache on
    every forward: at 8K positions that is the KV cache of every layer, read and written once per
    decode step. Here an append writes the new positions in place and a trim only moves the
    length; `keys`/`values` are views of the valid prefix, so attention reads the same numbers
    (bitwise: tests/test_cache.py). A buffer that fills up grows by a quarter (at least
    HEADROOM positions), so copies are rare; `reserve` sizes it ahead when the length is known.
    """

    HEADROOM = 256

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._wanted = 0  # positions reserved before the first update

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._length = 0
        self._key_buffer = key_states.new_empty(*key_states.shape[:-2], self._wanted, key_states.shape[-1])
        self._value_buffer = value_states.new_empty(*value_states.shape[:-2], self._wanted, value_states.shape[-1])
        self._show()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        if end > self.capacity:
            self.reserve(max(end + self.HEADROOM, self.capacity * 5 // 4))
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self._length = end
        self._show()
        return self.keys, self.values

    @property
    def capacity(self) -> int:
        return self._key_buffer.shape[-2]

    @torch.inference_mode()  # the buffers are inference tensors, made in a forward
    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions in all (one copy of the valid prefix)."""
        if not self.is_initialized:  # the buffers' shape is known at the first update
            self._wanted = max(self._wanted, positions)
            return
        if positions <= self.capacity:
            return
        keys = self._key_buffer.new_empty(*self._key_buffer.shape[:-2], positions, self._key_buffer.shape[-1])
        values = self._value_buffer.new_empty(*self._value_buffer.shape[:-2], positions, self._value_buffer.shape[-1])
        keys[..., : self._length, :] = self.keys
        values[..., : self._length, :] = self.values
        self._key_buffer, self._value_buffer = keys, values
        self._show()

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if self.is_initialized:
            self._length -= min(-tokens_to_remove, self._length)
            self._show()

    @torch.inference_mode()
    def keep(self, start: int, index: torch.Tensor) -> None:
        """Move positions `index` (increasing, all >= start) to start, start+1, ...; drop the rest."""
        count = index.numel()
        self._key_buffer[..., start : start + count, :] = self._key_buffer.index_select(2, index)
        self._value_buffer[..., start : start + count, :] = self._value_buffer.index_select(2, index)
        self._length = start + count
        self._show()

    def _show(self) -> None:
        self.keys = self._key_buffer[..., : self._length, :]
        self.values = self._value_buffer[..., : self._length, :]


class KVCache:
    """A model's KV cache seen as a sequence of positions that can be appended and trimmed.

    `preallocate` (the default) puts plain layers in PreallocatedLayer buffers; False keeps
    transformers' DynamicLayer (append by concatenation), for comparison."""

    def __init__(self, model: PreTrainedModel, preallocate: bool = True):
        self.hf_cache = DynamicCache(config=model.config)
        if preallocate:
            # Only plain layers: a sliding-window layer keeps its own bookkeeping.
            self.hf_cache.layers = [
                PreallocatedLayer() if type(layer) is DynamicLayer else layer for layer in self.hf_cache.layers
            ]

    def reserve(self, positions: int) -> None:
        """Size preallocated layers for `positions` positions (a no-op for dynamic ones)."""
        for layer in self.hf_cache.layers:
            if isinstance(layer, PreallocatedLayer):
                layer.reserve(positions)

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
            if type(layer) not in (DynamicLayer, PreallocatedLayer):
                kind = type(layer).__name__
                raise SpecdecError(f"tree verification needs plain dynamic cache layers, not {kind}")
            if not layer.is_initialized:  # a layer that shares another's keys holds none
                continue
            index = torch.tensor(offsets, dtype=torch.long, device=layer.keys.device) + start
            if isinstance(layer, PreallocatedLayer):
                layer.keep(start, index)  # in place
            else:
                layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys.index_select(2, index)], dim=2)
                layer.values = torch.cat([layer.values[:, :, :start], layer.values.index_select(2, index)], dim=2)
