"""Acceptance of a proposed block against the target's logits rows.

Alignment: `rows[i]` is the target's prediction after the pending token and the first i
draft tokens, so it judges draft token i+1 (0-based: rows[i] judges draft[i]) and rows[k],
the last row, gives the bonus token when all k are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingConfig, probs


@dataclass
class Verdict:
    accepted: int  # leading draft tokens accepted
    next_token: torch.Tensor  # shape [1]: the replacement, or the bonus when all passed


def verify_greedy(rows: torch.Tensor, draft: torch.Tensor) -> Verdict:
    """Longest prefix of `draft` equal to the target's argmax, then the target's own token."""
    choice = rows.argmax(-1)
    k = draft.numel()
    accepted = int((choice[:k] == draft).int().cumprod(0).sum())
    return Verdict(accepted, choice[accepted : accepted + 1])


def verify_sampling(
    rows: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling: accept draft[i] with probability min(1, p/q); on the first
    rejection draw from the normalised residual (p - q)+; bonus from the last row.

    `q` holds the distributions the draft tokens were drawn from ([k, vocab]); None means a
    deterministic proposer, i.e. q is a point mass on each draft token.
    """
    p = probs(rows, cfg)
    k = draft.numel()
    idx = torch.arange(k, device=draft.device)
    p_draft = p[idx, draft]
    q_draft = torch.ones_like(p_draft) if q is None else q[idx, draft]
    u = torch.rand(k, generator=generator, device=p.device)
    # u < p/q written without the division: a zero-probability token (p = 0) is never accepted.
    accepted = int((u * q_draft < p_draft).int().cumprod(0).sum())
    if accepted == k:
        return Verdict(k, torch.multinomial(p[k], 1, generator=generator))
    return Verdict(accepted, _sample_residual(p[accepted], q, draft, accepted, generator))


def _sample_residual(
    p_row: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    i: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    if q is None:
        residual = p_row.clone()
        residual[draft[i]] = 0
    else:
        residual = (p_row - _match_width(q[i], p_row)).clamp_min(0)
    mass = residual.sum()
    # A rejection has probability sum((p-q)+); when that is 0 no rejection can occur, so this
    # only guards rounding: fall back to p, which is then equal to q.
    if mass <= 0:
        residual, mass = p_row, p_row.sum()
    return torch.multinomial(residual / mass, 1, generator=generator)


def _match_width(q_row: torch.Tensor, p_row: torch.Tensor) -> torch.Tensor:
    """A draft head may have fewer rows than the target's (padding rows); those carry q = 0."""
    if q_row.numel() == p_row.numel():
        return q_row
    return torch.nn.functional.pad(q_row, (0, p_row.numel() - q_row.numel()))
