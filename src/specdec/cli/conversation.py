"""A conversation with a model, turn by turn (what `specdec chat` runs): the history as chat
messages, each turn's prompt the whole conversation in the model's chat template, decoded with
the caches of the turn before kept where they hold the prompt's start (Runtime.prefill's reuse),
so a follow-up turn prefills only what is new."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import SpecdecError
from ..prompts.chat import encode_messages

if TYPE_CHECKING:  # torch's models load where a command runs
    from ..decode.engine import CommitCallback, GenerationResult
    from ..decode.interface import Runtime
    from ..decode.proposal import Proposer


@dataclass(frozen=True)
class Sampling:
    """How each answer is decoded (specdec.generate's arguments of the same names)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class Turn:
    """One answer: the generation's result, the prompt's length, how many of its tokens the
    target's cache already held (not forwarded again), and the seconds from the message to the
    first answer token (None: none came)."""

    result: GenerationResult
    text: str
    prompt_tokens: int
    cached_tokens: int
    first_token_s: float | None


class Conversation:
    """The messages so far and the target and proposer that answer them, whose caches outlive a
    turn. A turn that ends in an exception leaves them in a state nobody vouches for: the next
    turn then prefills from nothing (`_cold`)."""

    def __init__(self, lm: Runtime, tokenizer, proposer: Proposer | None, sampling: Sampling,
                 system: str | None = None):
        self.lm, self.tokenizer, self.proposer, self.sampling = lm, tokenizer, proposer, sampling
        self.system = system
        self.messages: list[dict] = []
        self._held: list[int] = []  # the tokens behind the target's cached positions
        self._cold = True

    def reset(self) -> None:
        """Forget the history (the caches are overwritten by the next turn's prefill)."""
        self.messages = []
        self._held, self._cold = [], True

    def prompt(self, text: str) -> list[int]:
        """The token ids of the conversation with `text` as the next user message, ready for
        the answer."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return encode_messages(self.tokenizer, [*system, *self.messages, {"role": "user", "content": text}])

    def say(self, text: str, on_commit: CommitCallback | None = None) -> Turn:
        """Answer the user message `text`, streaming each round's tokens to `on_commit` (whose
        true return value stops the answer after that round, as generate's does). The message
        and its answer join the history, a partial answer too (GenerationInterrupted: what was
        committed before Ctrl-C, raised again); a turn that committed nothing leaves no trace."""
        from ..decode.engine import GenerationInterrupted, generate

        started = time.perf_counter()
        prompt = self.prompt(text)
        limit = self.lm.max_positions
        if limit is not None and len(prompt) >= limit:
            raise SpecdecError(f"the conversation has {len(prompt)} tokens, the model's context {limit}: "
                               "/reset starts a new one")
        first: list[float] = []

        def commit(tokens: list[int], from_draft: int) -> bool | None:
            if not first:
                first.append(time.perf_counter() - started)
            return on_commit(tokens, from_draft) if on_commit else None

        reuse = not self._cold
        self._cold = True  # until the generation returns
        cached = _shared(self._held, prompt[:-1]) if reuse else 0
        s = self.sampling
        room = s.max_new_tokens if limit is None else min(s.max_new_tokens, limit - len(prompt))
        try:
            result = generate(self.lm, prompt, drafter=self.proposer, max_new_tokens=room,
                              temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed,
                              on_commit=commit, reuse_prefix=reuse)
        except GenerationInterrupted as interrupt:
            self._remember(text, interrupt.result)
            raise
        self._cold = False
        self._held = (prompt + result.new_tokens)[: self.lm.length]
        return Turn(result, self._remember(text, result), len(prompt), cached, first[0] if first else None)

    def _remember(self, text: str, result: GenerationResult) -> str:
        """Add the message and its answer to the history; the answer's text."""
        answer = self.tokenizer.decode(result.new_tokens, skip_special_tokens=True)
        if result.new_tokens:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        return answer


def _shared(held: list[int], prompt: list[int]) -> int:
    """How many of `prompt`'s first tokens the cache holding `held` keeps (Runtime.prefill's reuse)."""
    from ..runtime.rows import shared_prefix

    return shared_prefix(torch.tensor(held, dtype=torch.long), torch.tensor(prompt, dtype=torch.long))
