"""Attention in which each query row's result depends only on that row and the keys it sees.

A fused attention kernel given a block of rows and a causal mask computes each row over the
block's key length, masked entries included, and in tiles sized by the block: the same token
then gets other bits alone (plain decoding) than as row i of a verify block. Here, in decode and
verify forwards, every row is one call over exactly its visible keys, with the query heads that
share a key head as the call's rows: the call's shapes depend on the row's position only, so its
result is the same in any block, by construction (tests/test_invariance.py).

Prefill forwards (many rows, no decode row to agree with) take transformers' SDPA path; a
forward runs row by row only inside `rows(...)`, which CausalLM enters for decode and verify.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "specdec"


@dataclass(frozen=True)
class RowKeys:
    """Which cache positions each row of a forward sees: a chain's row i sees positions
    [0, start + i]; a tree's row i sees [0, start) and the positions in `tree[i]`."""

    start: int
    tree: tuple[torch.Tensor, ...] | None = None  # per row: absolute positions after `start`


_plan: ContextVar[RowKeys | None] = ContextVar("specdec_rows", default=None)


@contextmanager
def rows(plan: RowKeys | None) -> Iterator[None]:
    """Run the forwards inside row by row (see the module docstring)."""
    token = _plan.set(plan)
    try:
        yield
    finally:
        _plan.reset(token)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: query [b, heads, q, d], key/value [b, kv_heads, n, d]."""
    plan = _plan.get()
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    return _row_by_row(query, key, value, plan, scaling), None


def _row_by_row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: RowKeys,
                scaling: float | None) -> torch.Tensor:
    batch, heads, count, dim = query.shape
    kv_heads = key.shape[1]
    out = query.new_empty(batch, count, heads, dim)
    for i in range(count):
        # [b, kv_heads, heads/kv_heads, d]: the query heads of one key head are one call's rows
        q = query[:, :, i].reshape(batch, kv_heads, heads // kv_heads, dim)
        if plan.tree is None:
            k, v = key[:, :, : plan.start + i + 1], value[:, :, : plan.start + i + 1]
        else:
            seen = plan.tree[i]
            k = torch.cat([key[:, :, : plan.start], key[:, :, seen]], dim=2)
            v = torch.cat([value[:, :, : plan.start], value[:, :, seen]], dim=2)
        row = F.scaled_dot_product_attention(q, k, v, scale=scaling)
        out[:, i] = row.reshape(batch, heads, dim)
    return out


def register() -> None:
    """Make NAME a transformers attention implementation (idempotent); its masks are SDPA's,
    used by the prefill path."""
    AttentionInterface.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
