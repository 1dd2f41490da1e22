"""A generation's logits rules (decode.rules) applied where a sequence's rows arise: the target's
prefill row, each row of a round's block (a chain or a tree) and each of the draft's guessing
steps, every row with the tokens before it, so that a block's row is transformed as the one-row
step of plain decoding at its position would be.

Rows are transformed in place where a rule does so, under inference mode: a runtime's logits are
inference tensors, and nothing reads a row's untransformed values after its rules ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .proposal import Drafting, Proposal
from .rules import LogitsRule, apply_rules


@torch.inference_mode()
def rule_rows(rules: Sequence[LogitsRule], rows: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
    """`rows` [n, vocab], row j predicting position first + j of `tokens`, through every rule."""
    return apply_rules(rules, rows, tokens, first)


@torch.inference_mode()
def rule_block(rules: Sequence[LogitsRule], rows: torch.Tensor, seq: torch.Tensor, proposal: Proposal) -> torch.Tensor:
    """A round's target rows for the block [pending, guesses] after the committed `seq`: a chain's
    row i follows seq and the first i guesses; a tree's row 1 + j follows seq and the path from
    the root to node j (row 0 follows seq alone)."""
    first = seq.numel()
    if proposal.parents is None:
        return apply_rules(rules, rows, torch.cat([seq, proposal.tokens]), first)
    parents = proposal.parents.tolist()
    out = [apply_rules(rules, rows[:1], seq, first)]
    for node in range(len(parents)):
        path = _path(parents, node)
        tokens = torch.cat([seq, proposal.tokens[torch.tensor(path, dtype=torch.long, device=seq.device)]])
        out.append(apply_rules(rules, rows[1 + node : 2 + node], tokens, tokens.numel()))
    return torch.cat(out)


def _path(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node`, in order."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def ruled_drafting(steps: Drafting, rules: Sequence[LogitsRule], seq: torch.Tensor, vocab: int,
                   head_ids: torch.Tensor | None) -> Drafting:
    """A proposer's drafting conversation with each draft row sent to it transformed by `rules`,
    so its guesses and their q come from the rules' rows. The first tokens a drafting feeds end
    the committed `seq` (what its draft has not seen), so the row after them predicts position
    len(seq); every later feed is its last guess, one position on. A row over a restricted head's
    columns (`head_ids`) is spread over the target's `vocab` for the rules and gathered back."""
    tokens = seq
    try:
        fed = next(steps)
    except StopIteration as done:
        return done.value
    guessing = False
    while True:
        row = yield fed
        if guessing:
            tokens = torch.cat([tokens, fed.view(-1)])
        guessing = True
        try:
            fed = steps.send(_rule_draft_row(rules, row, tokens, vocab, head_ids))
        except StopIteration as done:
            return done.value


@torch.inference_mode()
def _rule_draft_row(rules: Sequence[LogitsRule], row: torch.Tensor, tokens: torch.Tensor, vocab: int,
                    head_ids: torch.Tensor | None) -> torch.Tensor:
    """One draft row [columns] through the rules over the target's vocabulary, in its own columns."""
    if head_ids is not None:
        full = torch.full((vocab,), float("-inf"), dtype=row.dtype, device=row.device).index_copy_(0, head_ids, row)
        ruled = apply_rules(rules, full[None], tokens, tokens.numel())[0].index_select(0, head_ids)
        # A grammar may allow none of the head's ids: the draft's own row keeps q a distribution
        # (an all -inf row has none), and its guess, which the target's masked row gives p = 0, is
        # rejected with the residual the target's row itself: exact, the round's guesses wasted.
        return ruled if bool(torch.isfinite(ruled).any()) else row
    if row.numel() < vocab:  # a draft with fewer ids than the target: it can propose none of the rest
        row = torch.cat([row, row.new_full((vocab - row.numel(),), float("-inf"))])
    return apply_rules(rules, row[None, :vocab], tokens, tokens.numel())[0]
