"""The speculative round for one sequence: propose -> verify the block in one target forward
-> accept -> commit and trim both caches (decode.sequence holds the round's pieces and the cache
convention; decode.batch runs several sequences' rounds together)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import SpecdecError
from ..runtime.choose import runtime_of
from .interface import Runtime
from .proposal import Proposer
from .rules import LogitsRule
from .sampling import SamplingConfig
from .sequence import (
    CommitCallback,
    Decoding,
    GenerationResult,
    LogitsCallback,
    Options,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .batch import Plan

__all__ = ["CommitCallback", "GenerationInterrupted", "GenerationResult", "LogitsCallback", "generate"]


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
    plan: Plan | None = None,
    rules: Sequence[LogitsRule] = (),
) -> GenerationResult | list[GenerationResult]:
    """Generate up to `max_new_tokens` tokens from `target`, speculatively when `drafter` is
    given; the output is the target's own (greedy: same tokens; sampling: same distribution).

    `input_ids` is one prompt (token ids, or a tensor, flattened), or a list of prompts, which
    are decoded together (continuous batching, decode.batch: on the native runtime their rows
    share each forward) and give a list of results in their order, each as that prompt alone
    would give it (prompt i sampled from seed + i); `plan` then picks each round's guesses
    per prompt (decode.plan.measured_plan: by the cost model; None: the proposer's k).

    Sampling (temperature > 0) keeps, of the logits divided by the temperature, the top_k
    largest, then the nucleus of mass top_p, then the tokens with p >= min_p * max p (0 or None: off),
    as specdec.decode.sampling says.
    `eos_token_id=None` takes the model's generation config; pass [] to never stop early.
    `check=True` also asserts every cache layer's length each round (debug mode).
    `reuse_prefix=True` keeps the part of a passed-in runtime's (and the draft's) cache that
    already holds the prompt's prefix, so runs over one long context prefill it once.
    `rules` (decode.rules: decode.penalties' penalties and logit_bias, a grammar's mask) change
    every row of logits before a token is chosen from it, the target's and the draft's alike;
    built for one prompt (a rule may hold its state).
    """
    options = Options(max_new_tokens, SamplingConfig(temperature, top_k, top_p, min_p), seed, eos_token_id,
                      on_commit, on_target_logits, check, reuse_prefix, tuple(rules))
    lm = runtime_of(target)
    if _several(input_ids):
        if rules:
            raise SpecdecError("rules belong to one prompt (they may hold its state): generate the prompts one by "
                               "one, or give each its own rules through a decode.scheduler.Scheduler's options")
        from .scheduler import decode_together

        return decode_together(lm, input_ids, drafter, options, plan)
    d = Decoding(lm, input_ids, drafter, options)
    d.start()
    try:
        while not d.finished:
            proposal = d.propose(d.guesses())
            d.clock.lap("propose")
            rows = d.score(proposal)
            d.clock.lap("verify")
            d.settle(proposal, rows)
            d.clock.lap("accept")
    except KeyboardInterrupt as interrupt:
        raise GenerationInterrupted(d.result("interrupted")) from interrupt
    return d.result()


def _several(input_ids) -> bool:
    """Whether `input_ids` is a list of prompts (rather than one prompt's ids)."""
    return isinstance(input_ids, (list, tuple)) and bool(input_ids) and not isinstance(input_ids[0], int)
