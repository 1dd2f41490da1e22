"""One sequence being generated (Decoding): its committed tokens, sampling, proposer and the
pieces of a round, which engine.generate runs for one sequence and batch.Batch for several in
lockstep (their draft steps and target blocks in shared forwards).

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

import torch

from ..errors import SpecdecError
from .interface import Runtime
from .proposal import Drafting, Proposal, Proposer, drive
from .ruled import rule_block, rule_rows, ruled_drafting
from .rules import LogitsRule
from .sampling import SamplingConfig, pick
from .stats import GenerationStats, PhaseClock
from .verify import Verdict, verify_greedy, verify_sampling
from .verify_tree import verify_tree

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


@dataclass(frozen=True)
class Options:
    """What a generation is asked for, beside its prompt (see engine.generate)."""

    max_new_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    on_commit: CommitCallback | None = None
    on_target_logits: LogitsCallback | None = None
    check: bool = False
    reuse_prefix: bool = False
    # Per-row logits rules (decode.rules: penalties, logit_bias, a grammar's mask), built for this
    # generation alone since a rule may keep state; () changes nothing and costs nothing.
    rules: tuple[LogitsRule, ...] = ()


class Decoding:
    """A sequence from its prompt to its end: `start` prefills and commits the first token, then
    each round `drafting` (or `propose`) guesses, the caller scores `block` on the target, and
    `settle` accepts, commits and trims both caches."""

    def __init__(self, lm: Runtime, input_ids: torch.Tensor | Sequence[int], drafter: Proposer | None,
                 options: Options):
        if options.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
        self.lm, self.drafter, self.options = lm, drafter, options
        self._taught = False  # whether the proposer has been told how the sequence ended (result)
        self.cfg = options.sampling
        self.prompt = _prompt_tensor(input_ids, lm)
        eos = options.eos_token_id
        self.eos = frozenset(lm.eos_token_ids if eos is None else
                             (eos,) if isinstance(eos, int) else (int(t) for t in eos))
        self.generator = torch.Generator(device=lm.device)
        self.generator.manual_seed(options.seed if options.seed is not None else int(torch.seed()))
        self.stats = GenerationStats()
        self.clock = PhaseClock(self.stats.times, lm.device)
        self.seq = torch.empty(self.prompt.numel() + options.max_new_tokens, dtype=torch.long, device=lm.device)
        self.seq[: self.prompt.numel()] = self.prompt
        self.length = self.prompt.numel()
        self.draft_lm = drafter.draft_lm if drafter is not None else None
        self._models = [lm] if self.draft_lm is None else [lm, self.draft_lm]
        self.stopped = False  # on_commit asked to stop
        self.ended = False  # EOS committed or on_commit asked to stop
        self._asked, self._calls = 0, 0  # this round's k and the draft's calls before its proposal
        # Positions of the prompt the target's and the draft's lanes took from a prefix cache
        # before the start (decode.batch): kept, not forwarded again.
        self.cached = self.draft_cached = 0

    @property
    def new(self) -> int:
        return self.length - self.prompt.numel()

    @property
    def finished(self) -> bool:
        return self.ended or self.new >= self.options.max_new_tokens

    def start(self, prefill_draft: bool = True) -> None:
        """Prefill the target (and the draft) and commit the target's first token.
        `prefill_draft` False: the draft sees only the prompt's first token now and the rest with
        its first guesses (every drafting feeds what the draft has not seen), so a sequence that
        a batch's plan keeps plain never pays the draft's prefill."""
        self.begin(self.lm.prefill(self.prompt, reuse=self.options.reuse_prefix or self.cached > 0)[-1:],
                   prefill_draft)

    def begin(self, last: torch.Tensor, prefill_draft: bool = True) -> None:
        """Commit the target's first token from `last`, the prompt's last logits row [1, vocab],
        once the target's cache holds the prompt (start's prefill, or a batch that forwarded it
        in chunks beside other sequences' rounds); then the draft starts as start says. The
        first token goes out before the draft reads the prompt (a third of the target's prefill
        for the int3 draft), and a sequence that ends with it never has the draft read it."""
        if self.options.rules:
            last = rule_rows(self.options.rules, last, self.seq[: self.length], self.length)
        first = pick(last[0], self.cfg, self.generator)
        self.clock.lap("prefill")
        zero = torch.zeros((), dtype=torch.long, device=self.lm.device)
        self._commit(self.seq[:0], zero, first, zero.view(1), last)
        self.clock.lap("other")
        if self.drafter is not None and not self.finished:
            seen = self.draft_cached
            self.drafter.begin(self.prompt if prefill_draft else self.prompt[: seen + 1], self.lm.vocab_size,
                               reuse=self.options.reuse_prefix or seen > 0)
            self.clock.lap("prefill")  # the draft's read of the prompt: the prefill's cost, not a round's

    def guesses(self, most: int | None = None) -> int:
        """How many tokens this round may guess: the proposer's k (or `most`), leaving room for
        the target's own token so max_new_tokens is never overshot."""
        if self.drafter is None:
            return 0
        room = self.options.max_new_tokens - self.new - 1
        return max(0, min(self.drafter.k if most is None else most, room))

    def drafting(self, k: int) -> Drafting | None:
        """This round's guessing as a conversation (None: no guesses), for a caller that runs
        the draft forwards of several sequences together."""
        self._asked, self._calls = k, self.drafter.calls if k else 0
        if not k:
            return None
        seq = self.seq[: self.length]
        steps = self.drafter.drafting(seq, k, self.cfg, self.generator)
        if not self.options.rules:
            return steps
        lm = self.draft_lm if self.draft_lm is not None else self.lm  # a model-free drafting sends no row
        return ruled_drafting(steps, self.options.rules, seq, self.lm.vocab_size, lm.head_ids)

    def propose(self, k: int) -> Proposal:
        """This round's guesses, the proposer running its own draft forwards."""
        if k and self.options.rules and self.draft_lm is not None:  # the draft's rows through the rules
            with torch.inference_mode():
                return drive(self.drafting(k), self.draft_lm)
        self._asked, self._calls = k, self.drafter.calls if k else 0
        return self.drafter.propose(self.seq[: self.length], k, self.cfg, self.generator) if k else self.nothing()

    def nothing(self) -> Proposal:
        return Proposal(self.seq[:0])

    def block(self, proposal: Proposal) -> torch.Tensor:
        """The tokens the target scores this round: the pending token, then the guesses."""
        return torch.cat([self.seq[self.length - 1 : self.length], proposal.tokens])

    def score(self, proposal: Proposal) -> torch.Tensor:
        """The target's rows for this round's block: a chain, or a tree in one forward."""
        if proposal.parents is None:
            return self.lm.forward(self.block(proposal))
        return self.lm.forward_tree(self.block(proposal), proposal.parents)

    def settle(self, proposal: Proposal, rows: torch.Tensor) -> None:
        """Accept against the target's `rows`, commit, and trim both caches to the convention."""
        k = proposal.tokens.numel()
        steps = self.drafter.calls - self._calls if self._asked else 0
        if self.options.rules:
            rows = rule_block(self.options.rules, rows, self.seq[: self.length], proposal)
        accepted = self._commit(*_accept(self.lm, rows, proposal, self.cfg, self.generator), rows)
        self.lm.trim(self.length - 1)
        if self.drafter is not None:
            self.drafter.observe(k, accepted)
            self.drafter.rollback(self.length)
        self.stats.record_round(k, accepted, steps)
        # A round that asked for no guesses (the last one) leaves the draft untouched.
        _assert_caches(self.lm, self.draft_lm if self._asked else None, self.drafter is not None and self.drafter.may_lag,
                       self.length, self.options.check)

    def result(self, reason: str | None = None) -> GenerationResult:
        """What was generated; `reason` None: why it ended ("stopped", "eos" or "length")."""
        self.clock.settle()
        self.stats.target_calls = self.lm.calls
        self.stats.draft_calls = self.drafter.calls if self.drafter is not None else 0
        new = self.seq[self.prompt.numel() : self.length].tolist()
        self.stats.finish(len(new))
        if self.drafter is not None and not self._taught:  # once, however often the result is read
            self.drafter.finish(self.seq[: self.length])
            self._taught = True
        reason = reason or ("stopped" if self.stopped else "eos" if self.ended else "length")
        return GenerationResult(new, reason, self.stats)

    def _commit(self, guesses: torch.Tensor, count: torch.Tensor, next_token: torch.Tensor, judges: torch.Tensor,
                rows: torch.Tensor) -> int:
        """Append the first `count` guesses and the target's token (up to max_new_tokens and
        the first EOS); returns how many guesses were accepted. rows[judges[i]] is the target's
        row that judged committed token i (on_target_logits)."""
        o = self.options
        values, from_draft = _fetch(guesses, count, next_token, self._models)
        values = values[: self.prompt.numel() + o.max_new_tokens - self.length]
        hit = next((i for i, t in enumerate(values) if t in self.eos), None)
        if hit is not None:
            values = values[: hit + 1]
        self.seq[self.length : self.length + len(values)] = torch.cat([guesses[:from_draft], next_token])[: len(values)]
        self.length += len(values)
        if o.on_target_logits:
            o.on_target_logits(rows.index_select(0, judges[: len(values)]))
        if o.on_commit and o.on_commit(values, min(from_draft, len(values))):
            self.stopped = True
        self.ended = hit is not None or self.stopped
        return from_draft


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
