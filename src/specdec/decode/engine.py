"""The speculative round: propose -> verify the block in one target forward -> accept ->
commit and trim both caches.

Cache convention, asserted every round: the target's cache holds the committed sequence except
its last ("pending") token, which opens the next block, so a round costs exactly one target
forward: block = [pending, d1..dk], whose row i judges d(i+1) and whose last row gives the
bonus. The first new token comes from the prefill's last row, as in plain decoding.

A tree proposal (Proposal.parents set) is scored in one forward too, with a tree attention
mask (Runtime.forward_tree); the cache then keeps the pending token and the accepted path
only (Runtime.keep_positions), so the convention above holds after every round.

Host synchronisation: acceptance is decided on the device (verify.py) and a round reads back
one packed tensor (_fetch: the accepted count, both models' NaN/inf flags, the tokens), so on
CUDA the host waits for the GPU once per round, not per token (tests/test_host_sync.py counts
it). Proposers that decide on the host add their own reads: prompt lookup's n-gram search,
adaptive k's probability threshold or pay rule (one per guess), the tree walk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..errors import SpecdecError
from .interface import Runtime, runtime_of
from .proposal import Proposal, Proposer
from .sampling import SamplingConfig, pick
from .stats import GenerationStats, PhaseClock
from .verify import Verdict, verify_greedy, verify_sampling
from .verify_tree import verify_tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# on_commit(tokens, from_draft): the tokens committed this round, of which the first
# `from_draft` were the proposer's guesses and the rest came from the target. A true return
# value stops the generation after this round (finish_reason "stopped": a server's stop string
# or a client that went away), with the round recorded as any other.
CommitCallback = Callable[[list[int], int], bool | None]
# on_target_logits(rows): called just before on_commit with the target's logits rows that judged
# this round's committed tokens, row i for token i ([n, vocab], on the device): what a server's
# logprobs are read from. Reading them changes nothing the round decides.
LogitsCallback = Callable[[torch.Tensor], None]


@dataclass
class GenerationResult:
    new_tokens: list[int]
    finish_reason: str  # "eos", "length", "stopped" (on_commit asked), or "interrupted" (inside GenerationInterrupted)
    stats: GenerationStats = field(default_factory=GenerationStats)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during decoding; `.result` holds what was committed and the stats so far."""

    def __init__(self, result: GenerationResult):
        super().__init__("generation interrupted")
        self.result = result


def generate(
    target: PreTrainedModel | Runtime,
    input_ids: torch.Tensor | Sequence[int],
    *,
    drafter: Proposer | None = None,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = 0.0,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    on_commit: CommitCallback | None = None,
    on_target_logits: LogitsCallback | None = None,
    check: bool = False,
    reuse_prefix: bool = False,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens from `target`, speculatively when `drafter` is
    given; the output is the target's own (greedy: same tokens; sampling: same distribution).

    Sampling (temperature > 0) keeps, of the logits divided by the temperature, the top_k
    largest, then the nucleus of mass top_p, then the tokens with p >= min_p * max p (0 or None: off),
    as specdec.decode.sampling says.
    `eos_token_id=None` takes the model's generation config; pass [] to never stop early.
    `check=True` also asserts every cache layer's length each round (debug mode).
    `reuse_prefix=True` keeps the part of a passed-in runtime's (and the draft's) cache that
    already holds the prompt's prefix, so runs over one long context prefill it once.
    """
    cfg = SamplingConfig(temperature, top_k, top_p, min_p)
    lm = runtime_of(target)
    prompt = _prompt_tensor(input_ids, lm)
    if max_new_tokens < 1:
        raise SpecdecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos = frozenset(lm.eos_token_ids if eos_token_id is None else
                    (eos_token_id,) if isinstance(eos_token_id, int) else (int(t) for t in eos_token_id))
    generator = torch.Generator(device=lm.device)
    generator.manual_seed(seed if seed is not None else int(torch.seed()))

    stats = GenerationStats()
    clock = PhaseClock(stats.times, lm.device)
    seq = torch.empty(prompt.numel() + max_new_tokens, dtype=torch.long, device=lm.device)
    seq[: prompt.numel()] = prompt
    length = prompt.numel()

    draft_lm = drafter.draft_lm if drafter is not None else None
    models = [lm] if draft_lm is None else [lm, draft_lm]
    stopped = False  # on_commit asked to stop

    def commit(guesses: torch.Tensor, count: torch.Tensor, next_token: torch.Tensor, judges: torch.Tensor,
               rows: torch.Tensor) -> tuple[bool, int]:
        """Append the first `count` guesses and the target's token (up to max_new_tokens and
        the first EOS); returns (done: EOS reached or on_commit asked to stop, count).
        rows[judges[i]] is the target's row that judged committed token i (on_target_logits)."""
        nonlocal length, stopped
        values, from_draft = _fetch(guesses, count, next_token, models)
        values = values[: prompt.numel() + max_new_tokens - length]
        hit = next((i for i, t in enumerate(values) if t in eos), None)
        if hit is not None:
            values = values[: hit + 1]
        seq[length : length + len(values)] = torch.cat([guesses[:from_draft], next_token])[: len(values)]
        length += len(values)
        if on_target_logits:
            on_target_logits(rows.index_select(0, judges[: len(values)]))
        if on_commit and on_commit(values, min(from_draft, len(values))):
            stopped = True
        return hit is not None or stopped, from_draft

    last = lm.prefill(prompt, reuse=reuse_prefix)[-1:]
    first = pick(last[0], cfg, generator)
    if drafter is not None:
        drafter.begin(prompt, lm.vocab_size, reuse=reuse_prefix)
    clock.lap("prefill")
    zero = torch.zeros((), dtype=torch.long, device=lm.device)
    done, _ = commit(seq[:0], zero, first, zero.view(1), last)
    clock.lap("other")

    def result(reason: str) -> GenerationResult:
        clock.settle()
        stats.target_calls = lm.calls
        stats.draft_calls = drafter.calls if drafter is not None else 0
        new = seq[prompt.numel() : length].tolist()
        stats.finish(len(new))
        return GenerationResult(new, reason, stats)

    try:
        while not done and length - prompt.numel() < max_new_tokens:
            # Leave room for the target's own token: never overshoot max_new_tokens.
            room = max_new_tokens - (length - prompt.numel()) - 1
            k = min(drafter.k, room) if drafter is not None else 0
            calls = drafter.calls if k else 0
            proposal = drafter.propose(seq[:length], k, cfg, generator) if k else Proposal(seq[:0])
            steps = drafter.calls - calls if k else 0
            clock.lap("propose")
            rows = _score(lm, seq[length - 1 : length], proposal)
            clock.lap("verify")
            done, accepted = commit(*_accept(lm, rows, proposal, cfg, generator), rows)
            lm.trim(length - 1)
            if drafter is not None:
                drafter.observe(proposal.tokens.numel(), accepted)
                drafter.rollback(length)
            stats.record_round(proposal.tokens.numel(), accepted, steps)
            # A round that asked for no guesses (the last one) leaves the draft untouched.
            _assert_caches(lm, draft_lm if k else None, drafter is not None and drafter.may_lag, length, check)
            clock.lap("accept")
    except KeyboardInterrupt as interrupt:
        raise GenerationInterrupted(result("interrupted")) from interrupt
    return result("stopped" if stopped else "eos" if done else "length")


def _fetch(
    guesses: torch.Tensor, count: torch.Tensor, next_token: torch.Tensor, models: list[Runtime]
) -> tuple[list[int], int]:
    """The round's one device-to-host transfer: the accepted count, every model's first
    non-finite logits position (raised here) and the tokens, read together. Returns the
    committed tokens (accepted guesses, then the target's) and how many were guesses."""
    head = [count.view(1), *(model.nonfinite_at.view(1) for model in models)]
    packed = torch.cat([*head, guesses, next_token]).tolist()
    for model, position in zip(models, packed[1 : len(head)]):
        model.check_finite(position)
    accepted, tokens = packed[0], packed[len(head) :]
    return tokens[:accepted] + tokens[-1:], accepted


def _score(lm: Runtime, pending: torch.Tensor, proposal: Proposal) -> torch.Tensor:
    """The target's rows for the block [pending] + proposal: a chain, or a tree in one forward."""
    block = torch.cat([pending, proposal.tokens])
    if proposal.parents is None:
        return lm.forward(block)
    return lm.forward_tree(block, proposal.parents)


def _accept(
    lm: Runtime, rows: torch.Tensor, proposal: Proposal, cfg: SamplingConfig, generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The guesses in the order they would be committed, how many of them were accepted (0-d),
    the target's next token, and which of `rows` judged each of them in that order (the guesses,
    then the next token), all on the device. A tree's cache then keeps only the accepted path
    after the pending token, so it holds a prefix of the committed sequence."""
    if proposal.parents is None:
        verdict = _verify(rows, proposal, cfg, generator)
        judges = torch.arange(rows.shape[0], device=rows.device)  # row i judges guess i; row k the bonus
        return proposal.tokens, verdict.accepted, verdict.next_token, judges
    path, next_token = verify_tree(rows, proposal, cfg, generator)
    lm.keep_positions(lm.length - proposal.tokens.numel(), path)
    count = torch.tensor(len(path), device=lm.device)
    # Node j's row is rows[1 + j]; a node is judged by its parent's row (the root's: rows[0]).
    judges = torch.tensor([0, *(1 + node for node in path)], dtype=torch.long, device=lm.device)
    return proposal.tokens[torch.tensor(path, dtype=torch.long, device=lm.device)], count, next_token, judges


def _verify(rows: torch.Tensor, proposal: Proposal, cfg: SamplingConfig, generator) -> Verdict:
    if cfg.greedy:
        return verify_greedy(rows, proposal.tokens)
    return verify_sampling(rows, proposal.tokens, proposal.q, cfg, generator)


def _assert_caches(lm: Runtime, draft_lm: Runtime | None, may_lag: bool, length: int, check: bool) -> None:
    """The cache convention (docs/design.md). A proposer that `may_lag` (the hybrid: its draft
    is not called in lookup rounds) may leave its draft's cache further behind, never ahead."""
    if lm.length != length - 1:
        raise AssertionError(f"target cache holds {lm.length} positions, expected {length - 1}")
    lowest = 0 if may_lag else length - 2
    if draft_lm is not None and not lowest <= draft_lm.length <= length - 1:
        raise AssertionError(f"draft cache holds {draft_lm.length} positions, committed {length}")
    if check:
        for model in (lm, draft_lm) if draft_lm is not None else (lm,):
            if len(set(model.layer_lengths())) > 1:
                raise AssertionError(f"cache layers disagree: {model.layer_lengths()}")


def _prompt_tensor(input_ids: torch.Tensor | Sequence[int], lm: Runtime) -> torch.Tensor:
    prompt = torch.as_tensor(input_ids, dtype=torch.long, device=lm.device).flatten()
    if prompt.numel() == 0:
        raise SpecdecError("the prompt is empty: give at least one token")
    limit = lm.max_positions
    if limit is not None and prompt.numel() >= limit:
        raise SpecdecError(
            f"the prompt has {prompt.numel()} tokens but the model's context is {limit}: shorten it"
        )
    if int(prompt.max()) >= lm.vocab_size or int(prompt.min()) < 0:
        raise SpecdecError(
            f"prompt token ids must lie in [0, {lm.vocab_size}): does the tokenizer belong to this model?"
        )
    return prompt

