"""Helpers every runtime shares (runtime.hf's over transformers' model, runtime.native's own):
how long prompts are cut, what two sequences share, and a token tree's depths and visibility.
Nothing here imports a model library."""

from __future__ import annotations

import torch

from ..errors import SpecdecError

PREFILL_CHUNK = 1024  # prompt rows a prefill forwards at once (bounds the activations of a long prompt)


def tree_layout(parents: list[int]) -> tuple[list[int], torch.Tensor]:
    """Depths of [root, node 0..n-1] and which of them each one sees ([n+1, n+1] bool:
    row a, column b is True when b is a's ancestor or a itself; the root is index 0)."""
    n = len(parents)
    sees = torch.eye(n + 1, dtype=torch.bool)
    sees[:, 0] = True
    depth = [0] * (n + 1)
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise SpecdecError(f"node {i}'s parent {parent} must be -1 or an earlier node")
        sees[i + 1] |= sees[parent + 1]
        depth[i + 1] = depth[parent + 1] + 1
    return depth, sees


def shared_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D token tensors."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n
