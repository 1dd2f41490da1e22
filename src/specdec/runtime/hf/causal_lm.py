"""The small interface through which the engine reaches a model: forward a block over the
cache, read its logits rows, trim, length. Another runtime only has to provide these."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ...errors import SpecdecError
from ..rows import PREFILL_CHUNK, shared_prefix, tree_layout
from . import attention
from .kv_cache import KVCache, PreallocatedLayer, cache_keyword
from .model_facts import HEAD_IDS, eos_token_ids, logit_width
from .prepare import block_invariant, prefer_gqa_attention, prepare

# Prompts are prefilled in blocks of at most this many tokens: a forward's activations (the MLP's
# intermediate rows, attention scores where SDPA materialises them) grow with its rows: at 8K one
# block raised the 1.5B target's peak by 1.5 GiB, 1024-token blocks by 0.7 GiB, in about the
# same time (docs/kv_layout.md). Shorter prompts are one block, as before.


class CausalLM:
    """A causal LM together with one KV cache holding a prefix of the sequence."""

    shares_forward = False  # transformers' path has no multi-sequence forward: a lane at a time
    prefixes = None  # no prefix cache among lanes: reuse_prefix keeps a lane's own

    def __init__(self, model: PreTrainedModel, preallocate: bool = True, invariant: bool = True):
        """`preallocate`: the KV cache in buffers written in place (cache.PreallocatedLayer);
        False: transformers' DynamicCache, which concatenates on every forward.

        The model is repacked in place for specdec's forward (runtime.hf.prepare), once.
        `invariant` (a target): every decode and verify forward computes each row as it would be
        computed alone, so speculative output is bit for bit the plain one; logits in float32.
        A draft only proposes: False keeps its logits in the model's dtype and lets a tree's
        attention run batched. Chain forwards run attention row by row either way: for the 1-3
        rows of a draft step that is also the faster way (the 0.5B draft's step at 512 tokens of
        context, bf16, AVX-512 BF16 CPU: 24.8 ms against 31.0 through transformers' SDPA path,
        which runs one small query per head; docs/forward.md)."""
        prefer_gqa_attention(model)
        self.model = prepare(model, float32_logits=invariant)
        if invariant and not block_invariant(model):
            raise SpecdecError(
                f"this machine's {model.dtype} linear kernels round a row differently by block size (or "
                "the model has linear layers specdec does not pack): speculative output could differ "
                "from plain decoding; try --dtype float32"
            )
        self.invariant = invariant
        self.device = model.device
        self.vocab_size = logit_width(model)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.eos_token_ids = eos_token_ids(model)
        self.head_ids = getattr(model, HEAD_IDS, None)
        self._cache_kw = cache_keyword(model)
        self.preallocate = preallocate
        self.cache = KVCache(model, preallocate)
        self.calls = 0
        # The token ids behind the cache's positions (valid up to self.length), so a later
        # prompt that shares a prefix can reuse it (see prefill); grown by doubling.
        self._held = torch.empty(256, dtype=torch.long, device=self.device)
        self._clear_nonfinite()

    @property
    def length(self) -> int:
        return self.cache.length

    def lane(self, slots: int = 256) -> CausalLM:
        """Another sequence on the same model with a cache of its own (decode.batch runs the
        lanes of this runtime one forward each: transformers' path has no multi-sequence one);
        its cache grows as it goes, whatever `slots` says."""
        other = copy.copy(self)
        other._held = torch.empty_like(self._held)
        other.reset()
        return other

    def release(self) -> None:
        """Free the cache's memory (the lane's sequence ended)."""
        self.reset()

    @staticmethod
    def forward_lanes(blocks: Sequence[tuple[CausalLM, torch.Tensor, bool]]) -> list[torch.Tensor]:
        """Each (lane, tokens, last_only) block appended to its lane, one forward each."""
        return [lm.forward(tokens, last_only=last_only) for lm, tokens, last_only in blocks]

    def reset(self) -> None:
        self.cache = KVCache(self.model, self.preallocate)
        self.calls = 0
        self._clear_nonfinite()

    def _clear_nonfinite(self) -> None:
        # First sequence position whose logits were NaN/inf, -1 if none: kept on the device so
        # that a forward needs no host synchronisation; check_finite reads it.
        self.nonfinite_at = torch.full((), -1, dtype=torch.long, device=self.device)

    def check_finite(self, position: int | None = None) -> None:
        """Raise if a forward since the last prefill produced NaN/inf logits. `position` is
        nonfinite_at already read back by the caller (the engine reads it with the round's
        tokens); None reads it here."""
        where = int(self.nonfinite_at) if position is None else position
        if where >= 0:
            raise SpecdecError(
                f"the model produced NaN/inf logits at sequence position {where}; "
                "try --dtype float32 or check the model weights"
            )

    def prefill(self, prompt: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """Start a sequence: forward `prompt` over a fresh cache and return its last logits row
        [1, vocab]. With `reuse`, keep the cached positions that already hold the prompt's
        prefix and forward only the rest (at least the last token, whose row is returned).

        Reuse computes the shared prefix in another chunking than a fresh prefill, which moves
        logits by float rounding; callers compare outputs only among runs that reuse alike.
        So does a prompt longer than PREFILL_CHUNK, forwarded in blocks of that size.
        """
        if reuse:
            self.keep_prefix_of(prompt[:-1])
            self.calls = 0
            self._clear_nonfinite()
        else:
            self.reset()
        self.cache.reserve(prompt.numel() + PreallocatedLayer.HEADROOM)
        rest = prompt[self.length :]
        while rest.numel() > PREFILL_CHUNK:
            self._run(rest[:PREFILL_CHUNK], self._positions(PREFILL_CHUNK), None, True, None)
            rest = rest[PREFILL_CHUNK:]
        return self._run(rest, self._positions(rest.numel()), None, True, None)

    def trim(self, length: int) -> None:
        self.cache.trim(length)

    def layer_lengths(self) -> list[int]:
        return self.cache.layer_lengths()

    def keep_prefix_of(self, tokens: torch.Tensor) -> None:
        """Trim the cache to the longest prefix of its positions that holds `tokens`' start."""
        self.cache.trim(shared_prefix(self._held[: self.length], tokens))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append `tokens` (1-D) at the cache's next positions; return float32 logits rows
        [len(tokens), vocab], or only the last row's [1, vocab] when `last_only`. Every row is
        computed as if it were decoded alone (see __init__)."""
        plan = attention.RowKeys(self.cache.length)
        return self._run(tokens, self._positions(tokens.numel()), None, last_only, plan)

    def _positions(self, count: int) -> torch.Tensor:
        start = self.cache.length
        return torch.arange(start, start + count, device=self.device)

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Score a token tree in one forward: `tokens` = [root, node 0, ..., node n-1] (1-D),
        `parents[i]` = node i's parent index, -1 for the root (parents before children).
        Each row attends to the whole cache, the root, its node's ancestors and itself, at
        position cache length + depth, so row 1+i equals the last row of a plain forward of
        the root-to-node-i path. All n+1 positions are appended to the cache; keep_positions
        then keeps the accepted path. Returns float32 logits rows [n+1, vocab]."""
        start = self.cache.length
        depth, sees = tree_layout(parents.tolist())
        visible = torch.ones(len(depth), start + len(depth), dtype=torch.bool, device=self.device)
        visible[:, start:] = sees.to(self.device)
        # An additive mask works for both attention paths (eager adds it to the scores; a
        # boolean one would be added as 0/1 there); transformers passes 4D masks through as is.
        dtype = self.model.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        positions = start + torch.tensor(depth, device=self.device)
        plan = None
        if self.invariant:  # each row sees the cache and its own path, as in plain decoding
            seen = tuple(start + row.nonzero().flatten().to(self.device) for row in sees)
            plan = attention.RowKeys(start, seen)
        return self._run(tokens, positions, mask[None, None], False, plan)

    def keep_positions(self, start: int, offsets: list[int]) -> None:
        """KVCache.keep_positions, keeping the token ids behind the positions in step."""
        self.cache.keep_positions(start, offsets)
        index = torch.tensor(offsets, dtype=torch.long, device=self.device) + start
        self._hold(start, self._held[index])

    @torch.inference_mode()
    def _run(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, last_only: bool,
        plan: attention.RowKeys | None,
    ) -> torch.Tensor:
        """One model forward; `plan` None: batched attention (prefill, drafts), else row by row."""
        start = self.cache.length
        with attention.rows(plan):
            out = self.model(
                input_ids=tokens.view(1, -1),
                position_ids=positions.view(1, -1),
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=1 if last_only else 0,
                **{self._cache_kw: self.cache.hf_cache},
            )
        self.calls += 1
        self._hold(start, tokens)
        logits = out.logits[0].float()
        self._note_nonfinite(logits, start + tokens.numel() - logits.shape[0])
        return logits

    @torch.inference_mode()  # the buffer may be an inference tensor (grown in a forward)
    def _hold(self, start: int, tokens: torch.Tensor) -> None:
        """Record `tokens` as the ids behind positions start, start+1, ..."""
        end = start + tokens.numel()
        if end > self._held.numel():
            grown = torch.empty(max(end, 2 * self._held.numel()), dtype=torch.long, device=self.device)
            grown[:start] = self._held[:start]
            self._held = grown
        self._held[start:end] = tokens

    def _note_nonfinite(self, logits: torch.Tensor, first_row_position: int) -> None:
        """Keep the first position whose row is not finite, on the device (see check_finite)."""
        bad = ~torch.isfinite(logits).all(-1)
        where = first_row_position + bad.long().argmax()
        found = torch.where(bad.any(), where, -1)
        self.nonfinite_at = torch.where(self.nonfinite_at >= 0, self.nonfinite_at, found)
