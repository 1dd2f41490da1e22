"""Several sequences decoded together (continuous batching). Every round each running sequence
guesses, and the guessing steps of all of them run as one draft forward per step; then one
target forward scores every sequence's block; then each sequence accepts, commits and trims on
its own (decode.sequence, the same code as one sequence alone). Sequences join after their
prefill and leave when they end, between rounds.

Each sequence decodes on its own lane of the models (Runtime.lane: its own cache, the same
weights). On the native runtime the lanes of a model share one forward (NativeLM.forward_lanes)
and every row gets the bits it gets alone, so a greedy output is bit for bit the sequence's
output decoded alone, and sampling keeps each sequence's own generator and distribution.
transformers' runtime runs its lanes one forward each.

How many tokens each sequence guesses in a round is the planner's choice (decode.plan: the cost
model over the rows the whole batch would verify) when several run; a sequence alone, and every
sequence without a planner, guesses as its proposer says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ..errors import SpecdecError
from .interface import Runtime
from .proposal import Drafting, Proposal, Proposer
from .sequence import Decoding, GenerationResult, Options

Block = tuple[Runtime, torch.Tensor, bool]  # (lane, tokens, last_only)
# plan(sequences, most): how many tokens each running sequence guesses this round, each at most
# `most[i]` (its proposer's k within its room).
Plan = Callable[[Sequence[Decoding], Sequence[int]], list[int]]


def forward_blocks(blocks: Sequence[Block]) -> list[torch.Tensor]:
    """Each lane's block appended and its logits: one forward for all where the runtime runs
    several sequences at once, else one forward each."""
    together = getattr(blocks[0][0], "forward_lanes", None)
    if together is not None:
        return together(blocks)
    return [lm.forward(tokens, last_only=last_only) for lm, tokens, last_only in blocks]


class Batch:
    """The sequences running on `target` with proposals from forks of `drafter` (None: plain)."""

    def __init__(self, target: Runtime, drafter: Proposer | None = None, plan: Plan | None = None):
        self.target, self.drafter, self.plan = target, drafter, plan
        self.running: list[Decoding] = []

    def add(self, input_ids: torch.Tensor | Sequence[int], options: Options, slots: int = 256) -> Decoding:
        """Start a sequence: prefill it (alone) and commit its first token; it joins the next
        round unless it already ended (then its lanes are freed at once). Under a plan, a
        sequence that joins others has its draft read the prompt only when it first guesses
        (plain under load: never); one that starts alone guesses as its proposer says, so its
        draft reads the prompt now, before its first token, as generate's does.
        `slots`: the cache positions its lanes start with (they grow on demand; a server
        reserves what a request may reach, so its keys never move)."""
        drafter = self.drafter.fork(slots) if self.drafter is not None else None
        d = Decoding(self.target.lane(slots), input_ids, drafter, options)
        try:
            d.start(prefill_draft=self.plan is None or not self.running)
        except BaseException:
            _release(d)
            raise
        if d.finished:
            _release(d)
        else:
            self.running.append(d)
        return d

    def remove(self, d: Decoding) -> None:
        """Stop a running sequence now (its client went away) and free its lanes."""
        if d in self.running:
            self.running.remove(d)
            _release(d)

    @torch.inference_mode()
    def step(self) -> list[tuple[Decoding, BaseException | None]]:
        """One round of every running sequence; those that ended in it (removed, lanes freed),
        each with the error that ended it (None: it finished)."""
        running = self.running
        most = [d.guesses() for d in running]
        # One sequence alone guesses as its proposer says (the method asked for, or advised for
        # this machine); the plan arbitrates between sequences that share the rows.
        planned = self.plan is not None and len(running) > 1 and any(most)
        ks = self.plan(running, most) if planned else most
        proposals = self._propose(ks)
        _lap(running, "propose")
        rows = self._score(proposals)
        _lap(running, "verify")
        ended: list[tuple[Decoding, BaseException | None]] = []
        for d, proposal, block_rows in zip(running, proposals, rows):
            try:
                d.settle(proposal, block_rows)
            except Exception as error:  # noqa: BLE001 - one sequence fails, the others go on
                ended.append((d, error))
        _lap(running, "accept")
        ended += [(d, None) for d in running if d.finished and all(d is not e for e, _ in ended)]
        for d, _ in ended:
            self.remove(d)
        return ended

    def _propose(self, ks: Sequence[int]) -> list[Proposal]:
        """Every sequence's guesses, the draft steps of all that still guess in one forward."""
        proposals: list[Proposal | None] = [None] * len(self.running)
        talking: dict[int, tuple[Drafting, torch.Tensor]] = {}
        for i, (d, k) in enumerate(zip(self.running, ks)):
            steps = d.drafting(k)
            if steps is None:
                proposals[i] = d.nothing()
                continue
            try:
                talking[i] = (steps, next(steps))
            except StopIteration as done:
                proposals[i] = done.value
        while talking:
            items = list(talking.items())
            rows = forward_blocks([(self.running[i].draft_lm, tokens, True) for i, (_, tokens) in items])
            for (i, (steps, _)), row in zip(items, rows):
                try:
                    talking[i] = (steps, steps.send(row[-1]))
                except StopIteration as done:
                    del talking[i]
                    proposals[i] = done.value
        return proposals

    def _score(self, proposals: Sequence[Proposal]) -> list[torch.Tensor]:
        """The target's rows for every block: the chains in one forward, trees one by one."""
        rows: list[torch.Tensor | None] = [None] * len(proposals)
        chains = [i for i, p in enumerate(proposals) if p.parents is None]
        together = forward_blocks([(self.running[i].lm, self.running[i].block(proposals[i]), False)
                                   for i in chains]) if chains else []
        for i, got in zip(chains, together):
            rows[i] = got
        for i, p in enumerate(proposals):
            if p.parents is not None:
                rows[i] = self.running[i].score(p)
        return rows


def decode_together(target: Runtime, prompts: Sequence[torch.Tensor | Sequence[int]], drafter: Proposer | None,
                   options: Options, plan: Plan | None = None) -> list[GenerationResult]:
    """engine.generate over several prompts decoded together: the results in the prompts' order,
    each the same as that prompt generated alone (greedy: the same tokens, bit for bit on the
    native runtime; sampling: the same distribution, prompt i drawing from seed + i)."""
    if options.on_commit or options.on_target_logits:
        raise SpecdecError("on_commit and on_target_logits take one prompt: generate the prompts one by one, "
                           "or run a decode.batch.Batch with options per sequence")
    batch = Batch(target, drafter, plan)
    started = []
    try:
        for i, prompt in enumerate(prompts):
            seed = None if options.seed is None else options.seed + i
            started.append(batch.add(prompt, replace(options, seed=seed)))
        while batch.running:
            for _, error in batch.step():
                if error is not None:
                    raise error
    finally:
        for d in list(batch.running):
            batch.remove(d)
    return [d.result() for d in started]


def _lap(running: Sequence[Decoding], phase: str) -> None:
    for d in running:
        d.clock.lap(phase)


def _release(d: Decoding) -> None:
    for lm in (d.lm, d.draft_lm):
        if lm is not None:
            lm.release()
