"""Several sequences decoded together (continuous batching): one round at a time, for the
scheduler (decode.scheduler), which decides who runs and with what K/V. Every round each running sequence
guesses, and the guessing steps of all of them run as one draft forward per step; then one
target forward scores every sequence's block; then each sequence accepts, commits and trims on
its own (decode.sequence, the same code as one sequence alone). Sequences join between rounds
and leave when they end. A sequence's prompt can be forwarded in chunks inside the rounds'
target forwards (round_rows; where the lanes share one, on the native runtime): the others'
rounds go on while it prefills, instead of waiting seconds for its prompt.

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

import time
from collections.abc import Callable, Sequence

import torch

from .interface import Block, Runtime
from .proposal import Drafting, Proposal, Proposer
from .sequence import Decoding, Options

# Prompt rows a round forwards when no sequence decodes: between such rounds a server sees a
# client that left and starts a request that arrived (a 3,000-token prompt prefilled in one call
# held both for 30 s on the default pair). A quarter of runtime.rows.PREFILL_CHUNK: the weights
# are still read once per 256 prompt tokens.
ALONE_ROWS = 256

# plan(sequences, most, riding): how many tokens each running sequence guesses this round, each
# at most `most[i]` (its proposer's k within its room); riding(n): the prompt rows of joining
# sequences the round carries beside n decode rows (None: nobody joins).
Plan = Callable[[Sequence[Decoding], Sequence[int], Callable[[int], int] | None], list[int]]


def forward_blocks(blocks: Sequence[Block]) -> list[torch.Tensor]:
    """Each lane's block appended and its logits: one forward for all where the runtime runs
    several sequences at once (Runtime.shares_forward), else one forward each."""
    return blocks[0][0].forward_lanes(blocks)


class Batch:
    """The sequences running on `target` with proposals from forks of `drafter` (None: plain)."""

    def __init__(self, target: Runtime, drafter: Proposer | None = None, plan: Plan | None = None,
                 round_rows: int = 0, prefix_cache: bool = False):
        """`round_rows`: the rows a round's target forward is filled up to with the prompts of
        sequences that join (at least a quarter of them, however many the running blocks take;
        vLLM's token budget per step); 0: a sequence added beside others is prefilled alone at
        once (the default here: sequences added together, as generate's, have nobody to wait
        for). Chunks keep the running sequences' tokens coming while a prompt is forwarded, at
        the price of the joiner's first token and a little of the work in all (docs/batching.md
        has the measurements; a server's default: serve.worker.ROUND_ROWS).
        `prefix_cache`: a sequence's lanes start from the longest prefix of its tokens their
        runtime's prefix cache holds (Runtime.prefixes), and keep their positions there when it
        ends, unless it failed."""
        self.target, self.drafter, self.plan, self.round_rows = target, drafter, plan, round_rows
        self.prefix_cache = prefix_cache
        self.running: list[Decoding] = []
        self.joining: dict[Decoding, int] = {}  # sequences being prefilled: prompt rows forwarded so far

    @property
    def sequences(self) -> list[Decoding]:
        """Every sequence the batch holds: the running ones, then those still prefilling."""
        return [*self.running, *self.joining]

    def add(self, input_ids: torch.Tensor | Sequence[int], options: Options, slots: int = 256) -> Decoding:
        """Start a sequence. With round_rows it joins: its prompt rides in the next rounds (beside
        the others', or in rounds of its own when none decodes, so a caller sees cancellations
        and arrivals between them) and its first token comes with the round that forwards the
        prompt's end; without, it is prefilled now and its first token committed. It runs from
        the round after that unless it already ended (then its lanes are freed at once). Under a plan, a sequence's
        draft reads the prompt only when the sequence first guesses (plain under load: never),
        even one that starts alone: its first token comes before the draft's prefill, and by its
        first round the plan knows who joined meanwhile (a server's requests sent at once arrive
        one by one): still alone, it guesses as its proposer says (decode.plan), else the plan
        weighs the draft's catch-up against the tokens it buys (never while a prompt rides).
        Without a plan every draft reads the prompt now, as generate's does.
        `slots`: the cache positions its lanes start with (they grow on demand; a server
        reserves what a request may reach, so its keys never move)."""
        drafter = self.drafter.fork(slots) if self.drafter is not None else None
        d = Decoding(self.target.lane(slots), input_ids, drafter, options)
        self._seed(d, d.prompt)
        self._begin(d)
        return d

    def _seed(self, d: Decoding, rows: torch.Tensor) -> None:
        """Start `d`'s lanes (holding nothing) from what their prefix caches hold of `rows`
        (the prompt, or a resumed sequence's committed tokens but the pending one)."""
        if self.prefix_cache:
            d.cached = d.lm.prefixes.start(d.lm, rows)
            if d.draft_lm is not None and d.draft_lm.prefixes is not None:
                d.draft_cached = d.draft_lm.prefixes.start(d.draft_lm, rows)

    def _joins(self, d: Decoding) -> bool:
        """Whether `d` prefills in rounds: where the runtime forwards lanes together (its chunks
        then change no bits: transformers' runtime prefills with another attention than a
        round's rows), from a fresh cache, and with a draft that needs only the prompt's first
        token (a plan's)."""
        return (self.round_rows > 0 and self.target.shares_forward
                and not d.options.reuse_prefix
                and (d.drafter is None or self.plan is not None))

    def resume(self, d: Decoding) -> None:
        """Run again a sequence that `remove` stopped (a scheduler preempted it to free its K/V):
        the target's cache is recomputed from the committed tokens (but the pending one), in
        chunks inside the rounds where it joins as a prompt would, else now; its draft reads
        them with its next guesses. On the native runtime every row gets the bits it got the
        first time, so the sequence goes on as if never stopped. One stopped before its first
        token starts as `add` starts it (and may end at once: then it is not running)."""
        self._seed(d, rows_of(d))
        self._begin(d)

    def _begin(self, d: Decoding) -> None:
        """`d` joins the rounds where it may, else its rows are forwarded now: a fresh
        sequence's prompt (its first token committed) or a resumed one's committed tokens."""
        if self._joins(d):
            self.joining[d] = d.lm.length  # what its lane took from the prefix cache
            return
        try:
            if d.new:
                d.lm.prefill(rows_of(d), reuse=d.cached > 0)
            else:
                d.start(prefill_draft=self.plan is None)
        except BaseException:
            _release(d)
            raise
        if d.finished:
            _release(d, self.prefix_cache)
        else:
            self.running.append(d)

    def remove(self, d: Decoding, keep: bool = True) -> None:
        """Stop a sequence now (its client went away) and free its lanes, their positions kept
        in the prefix cache if the batch keeps one and `keep` (False: it failed)."""
        if d in self.running:
            self.running.remove(d)
        elif self.joining.pop(d, None) is None:
            return
        _release(d, keep and self.prefix_cache)

    @torch.inference_mode()
    def step(self) -> list[tuple[Decoding, BaseException | None]]:
        """One round of every running sequence; those that ended in it (removed, lanes freed),
        each with the error that ended it (None: it finished)."""
        running = self.running
        most = [d.guesses() for d in running]
        # The plan arbitrates between sequences that share the rows, prompts being forwarded
        # among them; a sequence alone guesses as its proposer says (the method asked for, or
        # advised for this machine) unless the plan finds its draft's catch-up not worth it.
        riding = self._riding if self.joining and self.running else None
        ks = self.plan(running, most, riding) if self.plan is not None and any(most) else most
        proposals = self._propose(ks)
        _lap(running, "propose")
        chunks = self._chunks(sum(p.tokens.numel() + 1 for p in proposals))
        rows, prompt_rows = self._score(proposals, chunks)
        _lap(running, "verify")
        ended: list[tuple[Decoding, BaseException | None]] = []
        for d, proposal, block_rows in zip(running, proposals, rows):
            try:
                d.settle(proposal, block_rows)
            except Exception as error:  # noqa: BLE001 - one sequence fails, the others go on
                ended.append((d, error))
        _lap(running, "accept")
        ended += [(d, None) for d in running if d.finished and all(d is not e for e, _ in ended)]
        ended += self._prefilled(chunks, prompt_rows)
        for d, error in ended:
            self.remove(d, keep=error is None)
        return ended

    def _chunks(self, rows: int) -> list[tuple[Decoding, torch.Tensor]]:
        """This round's prompt chunks of the joining sequences, the fewest rows left first (a
        short prompt that arrives during a long one's prefill gets its first token in the next
        round, not after the long prompt), beside the running sequences' `rows`."""
        room = self._room(rows)
        chunks = []
        for d, done in sorted(self.joining.items(), key=lambda item: rows_of(item[0]).numel() - item[1]):
            if room <= 0:
                break
            chunk = rows_of(d)[done : done + room]
            chunks.append((d, chunk))
            room -= chunk.numel()
        return chunks

    def _room(self, rows: int) -> int:
        """The prompt rows a round takes beside `rows` decode rows: up to round_rows, at least a
        quarter of it; with none running, ALONE_ROWS."""
        return max(self.round_rows - rows, self.round_rows // 4) if self.running else max(self.round_rows, ALONE_ROWS)

    def _riding(self, rows: int) -> int:
        """The prompt rows a round with `rows` decode rows would carry."""
        return min(self._room(rows), sum(rows_of(d).numel() - done for d, done in self.joining.items()))

    def _prefilled(self, chunks: Sequence[tuple[Decoding, torch.Tensor]],
                   rows: Sequence[torch.Tensor]) -> list[tuple[Decoding, BaseException | None]]:
        """Advance the joining sequences by their chunks; one whose prompt is all forwarded
        commits its first token (a resumed one has it) and runs from the next round, unless that
        ended it (returned)."""
        ended: list[tuple[Decoding, BaseException | None]] = []
        for (d, chunk), last in zip(chunks, rows):
            self.joining[d] += chunk.numel()
            if self.joining[d] < rows_of(d).numel():
                continue
            del self.joining[d]
            self.running.append(d)
            if d.new:
                continue
            try:
                d.begin(last, prefill_draft=False)
            except Exception as error:  # noqa: BLE001 - one sequence fails, the others go on
                ended.append((d, error))
                continue
            if d.finished:
                ended.append((d, None))
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
            blocks = [(self.running[i].draft_lm, tokens, True) for i, (_, tokens) in items]
            rows = self._timed("draft", blocks) if all(t.numel() == 1 for _, t, _ in blocks) else forward_blocks(blocks)
            for (i, (steps, _)), row in zip(items, rows):
                try:
                    talking[i] = (steps, steps.send(row[-1]))
                except StopIteration as done:
                    del talking[i]
                    proposals[i] = done.value
        return proposals

    def _score(self, proposals: Sequence[Proposal], chunks: Sequence[tuple[Decoding, torch.Tensor]],
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The target's rows for every block, and each prompt chunk's last row: the chains and
        the chunks in one forward, trees one by one."""
        rows: list[torch.Tensor | None] = [None] * len(proposals)
        chains = [i for i, p in enumerate(proposals) if p.parents is None]
        blocks = [(self.running[i].lm, self.running[i].block(proposals[i]), False) for i in chains]
        blocks += [(d.lm, chunk, True) for d, chunk in chunks]
        together = self._timed("verify", blocks) if blocks else []
        for i, got in zip(chains, together):
            rows[i] = got
        for i, p in enumerate(proposals):
            if p.parents is not None:
                rows[i] = self.running[i].score(p)
        return rows, together[len(chains):]

    def _timed(self, cost: str, blocks: Sequence[Block]) -> list[torch.Tensor]:
        """forward_blocks, its time told to the plan (a decode.plan.Planner re-times its costs
        from the forwards it chose; a plan without `observe` is not told)."""
        observe = getattr(self.plan, "observe", None)
        if observe is None:
            return forward_blocks(blocks)
        start = time.perf_counter()
        got = forward_blocks(blocks)
        observe(cost, sum(tokens.numel() for _, tokens, _ in blocks) if cost == "verify" else len(blocks),
                time.perf_counter() - start)
        return got


def _lap(running: Sequence[Decoding], phase: str) -> None:
    for d in running:
        d.clock.lap(phase)


def rows_of(d: Decoding) -> torch.Tensor:
    """What a joining sequence's target cache must hold before it runs: its prompt, or for a
    resumed one every committed token but the pending one (decode.sequence's convention)."""
    return d.seq[: d.length - 1] if d.new else d.prompt


def _release(d: Decoding, keep: bool = False) -> None:
    """Free `d`'s lanes; `keep`: their positions stay in their prefix caches."""
    for lm in (d.lm, d.draft_lm):
        if lm is not None and keep and lm.prefixes is not None:
            lm.prefixes.park(lm)
        elif lm is not None:
            lm.release()
