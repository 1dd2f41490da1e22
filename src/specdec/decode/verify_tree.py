"""Acceptance of a proposed token tree against the target's logits rows.

Alignment: rows[0] is the target's prediction after the pending token (the root), so it judges
the root's children; rows[1 + i] is its prediction after the root-to-node-i path, so it judges
node i's children and, if the walk stops at node i, gives the next token.

Greedy: from the root, move to the first child whose token is the current row's argmax; where
no child matches, that argmax is the next token (a bonus when the node is a leaf). The result
is the target's greedy continuation, whatever the tree.

Sampling (multi-draft recursive rejection, as in Miao et al., SpecInfer, 2024, and Chen et
al.'s multi-draft speculative sampling): at the current node r starts as the target's
distribution p of its row. Each child c, in index order, is tried once: a child drawn from q_c
is accepted with probability min(1, r(x_c) / q_c(x_c)), and on rejection r becomes the
normalised residual (r - q_c)+; a deterministic child is the case q_c = point mass on x_c: it
is accepted with probability r(x_c), and on rejection r(x_c) is set to 0 and r renormalised.
An accepted child becomes the current node (r = p of its row); when no child is accepted, the
next token is drawn from r.

Why this is exact. One step: if x ~ q and we accept x with probability min(1, r(x)/q(x)), else
draw from (r - q)+ / sum (r - q)+, then P(y) = min(q(y), r(y)) + (r(y) - q(y))+ = r(y), since
the rejection probability is 1 - sum min(q, r) = sum (r - q)+. Trying the children in turn is
this step applied recursively: by induction from the last child (whose failure leads to the
draw from r), the token that comes out of the node, accepted child or final draw, is
distributed as the r in force when its first child is tried, i.e. as p. The induction only
needs that, when child c is tried, x_c is distributed as q_c given everything the verifier has
looked at so far. What it has looked at (the path's nodes, the rejected earlier siblings of
them and of c, and independent uniforms) all precede c in index order, so it suffices that the
proposer builds nodes in index order with each sampled node drawn from q[i] given the nodes
before it and each deterministic node a function of them. An accepted child's subtree was drawn
given its path, so the walk below it repeats the argument with the target's next distribution;
the committed sequence therefore has the target's own law. Siblings drawn from the same q
without replacement, or a point-mass candidate chosen after seeing later nodes, would break it.
"""

from __future__ import annotations

import torch

from .proposal import Proposal
from .sampling import SamplingConfig, draw, probs
from .verify import residual


def verify_tree(
    rows: torch.Tensor, proposal: Proposal, cfg: SamplingConfig, generator: torch.Generator | None
) -> tuple[list[int], torch.Tensor]:
    """The accepted root-to-node path (node indices, in order) and the next token (shape [1])."""
    children = _children(proposal.parents.tolist())
    tokens = proposal.tokens.tolist()
    if cfg.greedy:
        return _walk_greedy(rows, tokens, children)
    return _walk_sampling(rows, proposal, tokens, children, cfg, generator)


def _children(parents: list[int]) -> dict[int, list[int]]:
    """Node -> its children in index order (the root is -1)."""
    out: dict[int, list[int]] = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(parent, []).append(i)
    return out


def _walk_greedy(
    rows: torch.Tensor, tokens: list[int], children: dict[int, list[int]]
) -> tuple[list[int], torch.Tensor]:
    choice = rows.argmax(-1)
    path, node = [], -1
    while True:
        best = int(choice[node + 1])
        child = next((c for c in children.get(node, []) if tokens[c] == best), None)
        if child is None:
            return path, choice[node + 1 : node + 2]
        path.append(child)
        node = child


def _walk_sampling(
    rows: torch.Tensor,
    proposal: Proposal,
    tokens: list[int],
    children: dict[int, list[int]],
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> tuple[list[int], torch.Tensor]:
    p = probs(rows, cfg)
    sampled = _sampled_flags(proposal, len(tokens))
    path, node = [], -1
    while True:
        r = p[node + 1]
        accepted = None
        for child in children.get(node, []):
            x = tokens[child]
            q_row = proposal.q[child] if sampled[child] else None
            q_x = float(q_row[x]) if q_row is not None else 1.0  # x was drawn from q_row
            u = float(torch.rand(1, generator=generator, device=p.device))
            # u < r/q written without the division: a token with r = 0 is never accepted.
            if u * q_x < float(r[x]):
                accepted = child
                break
            q_rows = None if q_row is None else q_row[None]
            r = residual(r[None], q_rows, proposal.tokens[child : child + 1])[0]
        if accepted is None:
            return path, draw(r, generator)
        path.append(accepted)
        node = accepted


def _sampled_flags(proposal: Proposal, n: int) -> list[bool]:
    if proposal.q is None or proposal.sampled is None:
        return [False] * n
    return proposal.sampled.tolist()
