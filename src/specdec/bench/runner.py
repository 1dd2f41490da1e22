"""The benchmark protocol: warm up every method once, then run the methods interleaved per prompt
(A B C, A B C, ...) so that slow drifts of the machine (heat, other load) hit them alike, writing
each row as soon as it is measured and skipping rows a previous run already wrote.

With a concurrency of N (endpoints only), N consecutive prompts form a wave that each method
serves at once (A on prompts 1..N together, then B on them, ...); a wave's rows are written
together once all of its requests have finished."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from ..methods.spec import Method
from ..prompts.datasets import Prompt
from .row import Measured
from .store import RowWriter, read_rows


class Executes(Protocol):
    def run(self, method: Method, prompt_ids: list[int], repeat: int) -> Measured: ...

    def warm_up(self, method: Method, prompt_ids: list[int]) -> None: ...


class ExecutesWaves(Executes, Protocol):
    def run_wave(self, method: Method, prompts: list[list[int]], repeat: int) -> list[Measured]: ...


@dataclass(frozen=True)
class EncodedPrompt:
    prompt: Prompt
    ids: list[int]


@dataclass(frozen=True)
class Run:
    item: EncodedPrompt
    repeat: int
    method: Method


def pending_runs(
    prompts: list[EncodedPrompt], methods: list[Method], repeats: int, done: set[tuple[str, str, int]]
) -> list[Run]:
    """Every (prompt, repeat, method) not in `done`, in the interleaved order."""
    return [
        Run(item, repeat, method)
        for item in prompts
        for repeat in range(repeats)
        for method in methods
        if (item.prompt.id, method.label, repeat) not in done
    ]


def waves(runs: list[Run], concurrency: int) -> list[list[Run]]:
    """`runs` (in pending_runs' order) grouped into waves: the runs of one method and repeat on
    `concurrency` consecutive prompts of the list. Runs come prompt by prompt, so the waves'
    first appearances are already in the interleaved order (chunk, repeat, method)."""
    prompt_order = list(dict.fromkeys(run.item.prompt.id for run in runs))
    chunk = {prompt: i // concurrency for i, prompt in enumerate(prompt_order)}
    grouped: dict[tuple, list[Run]] = {}
    for run in runs:
        grouped.setdefault((chunk[run.item.prompt.id], run.repeat, run.method.label), []).append(run)
    return list(grouped.values())


def run_bench(
    out: Path,
    config: dict,
    prompts: list[EncodedPrompt],
    methods: list[Method],
    repeats: int,
    executor: Executes | ExecutesWaves,
    progress: bool = True,
    concurrency: int = 1,
) -> int:
    """Measure every run not yet in out/results.jsonl; return how many rows were written.
    An interrupt or error propagates after the rows finished so far are safely on disk."""
    done = {(r["prompt_id"], r["method"], r["repeat"]) for r in read_rows(out)}
    todo = pending_runs(prompts, methods, repeats, done)
    with RowWriter(out, config) as writer:
        if not todo:
            return 0
        _warm_up(todo, executor)
        with tqdm(total=len(todo), unit="run", desc="bench", disable=not progress) as bar:
            for wave in waves(todo, concurrency):
                first = wave[0]
                bar.set_postfix_str(f"{first.method.label} on {', '.join(r.item.prompt.id for r in wave)}",
                                    refresh=False)
                for run, measured in zip(wave, _measure(wave, executor)):
                    writer.write(_row(run, measured))
                bar.update(len(wave))
    return len(todo)


def _measure(wave: list[Run], executor: Executes | ExecutesWaves) -> list[Measured]:
    first = wave[0]
    if len(wave) == 1:
        return [executor.run(first.method, first.item.ids, first.repeat)]
    return executor.run_wave(first.method, [run.item.ids for run in wave], first.repeat)


def _warm_up(todo: list[Run], executor: Executes) -> None:
    """One discarded generation per method still to run, on the first prompt still to run:
    first calls pay for memory allocation and thread start-up, which no row should carry."""
    first = todo[0].item
    for method in dict.fromkeys(run.method for run in todo):
        executor.warm_up(method, first.ids)


def _row(run: Run, measured: Measured) -> dict:
    p = run.item.prompt
    return {
        "prompt_id": p.id,
        "category": p.category,
        "method": run.method.label,
        "repeat": run.repeat,
        "n_prompt": len(run.item.ids),
        # the prompt's tokens over the time to the first new token (a server's: over its TTFT)
        "prefill_tokens_per_s": len(run.item.ids) / measured.prefill_s if measured.prefill_s > 0 else None,
        **measured.fields(),
    }
