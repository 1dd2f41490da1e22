"""Acceptance of a proposed block against the target's logits rows.

Alignment: `rows[i]` is the target's prediction after the pending token and the first i
draft tokens, so it judges draft token i+1 (0-based: rows[i] judges draft[i]) and rows[k],
the last row, gives the bonus token when all k are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingConfig, draw, probs


@dataclass
class Verdict:
    # Both stay on the rows' device, so deciding a round needs no host synchronisation; the
    # engine reads them back together with the tokens in one transfer.
    accepted: torch.Tensor  # 0-d: how many leading draft tokens were accepted
    next_token: torch.Tensor  # shape [1]: the replacement, or the bonus when all passed


def verify_greedy(rows: torch.Tensor, draft: torch.Tensor) -> Verdict:
    """Longest prefix of `draft` equal to the target's argmax, then the target's own token."""
    choice = rows.argmax(-1)
    accepted = _leading(choice[: draft.numel()] == draft)
    return Verdict(accepted, choice.index_select(0, accepted.view(1)))


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
    accepted = _leading(u * q_draft < p_draft)
    # Row i of `fallback` is what a rejection of guess i draws from; row k is p of the last
    # row, the bonus. All k residuals are formed so the choice stays on the device.
    fallback = torch.cat([residual(p[:k], q, draft), p[k:]])
    return Verdict(accepted, draw(fallback.index_select(0, accepted.view(1))[0], generator))


def residual(p: torch.Tensor, q: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
    """Rows of the normalised residual (p - q)+ after rejecting `tokens` ([n]) drawn from q
    ([n, width], width <= p's: a draft head may lack the target's padding rows, which carry
    q = 0); q None means each token was a point mass, so the residual is p without it."""
    if q is None:
        out = p.scatter(-1, tokens.view(-1, 1), 0.0)
    else:
        out = (p - torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))).clamp_min(0)
    mass = out.sum(-1, keepdim=True)
    # A rejection has probability sum((p-q)+); when that is 0 no rejection can occur, so this
    # only guards rounding: fall back to p, which then equals q.
    return torch.where(mass > 0, out / mass.clamp_min(torch.finfo(out.dtype).tiny), p)


def _leading(hits: torch.Tensor) -> torch.Tensor:
    """Number of leading True values of a 1-D bool tensor, 0-d long."""
    return hits.long().cumprod(0).sum()
