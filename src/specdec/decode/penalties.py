"""Repetition penalties and logit_bias as per-row logits rules (decode.rules), each row's counts
read from the tokens before that row, so a speculative block's row i is penalised as plain
decoding's step at its position would be (the guesses before it counted).

The definitions, and whose they are:
- logit_bias (OpenAI's, llama.cpp's, vLLM's): logit += bias[token], applied first, as llama.cpp's
  chain (its logit-bias sampler leads) and vLLM's sampler (logits processors before penalties) do.
- repetition (llama.cpp's repeat_penalty, vLLM's repetition_penalty, from the CTRL paper): every
  token present in the window, counted once: a positive logit divided by the penalty, a negative
  one multiplied. llama.cpp's window is the last repeat_last_n tokens of prompt and output
  together (llama-server pushes every prompt token into its sampler before the first draw;
  64 by default, -1 the whole context); vLLM's is the whole prompt and output (window None).
- presence and frequency (OpenAI's): logit -= count * frequency + (count > 0) * presence, count
  the token's occurrences in the generated tokens only (OpenAI's and vLLM's definition;
  llama.cpp counts them over its repeat window instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import SpecdecError
from .rules import LogitsRule

PENALTY_RANGE = 2.0  # OpenAI's presence and frequency penalties lie in [-2, 2]
BIAS_RANGE = 100.0  # and each logit_bias in [-100, 100]


@dataclass(frozen=True)
class Penalties:
    """A generation's penalty settings (all off by default); `rules` makes its rules."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0  # 1: off; > 1 discourages repeats
    window: int | None = None  # repetition's last tokens of prompt + output; None: all of them
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs

    def __post_init__(self) -> None:
        for name in ("presence", "frequency"):
            value = getattr(self, name)
            if not -PENALTY_RANGE <= value <= PENALTY_RANGE:
                raise SpecdecError(f"{name} penalty must be in [-2, 2] (0: off), got {value}")
        if not (math.isfinite(self.repetition) and self.repetition > 0):
            raise SpecdecError(f"repetition penalty must be > 0 (1: off; 1.1 is a usual value), got {self.repetition}")
        if self.window is not None and self.window < 0:
            raise SpecdecError(f"the repetition window must be >= 0 tokens (0: off), got {self.window}")
        for token, bias in self.logit_bias:
            if not -BIAS_RANGE <= bias <= BIAS_RANGE:
                raise SpecdecError(f"logit_bias for token {token} must be in [-100, 100], got {bias}")

    def rules(self, prompt_length: int, vocab: int) -> tuple[LogitsRule, ...]:
        """The rules of these settings for a prompt of `prompt_length` tokens and a target
        scoring `vocab` ids, bias first; none for settings that are all off."""
        rules: list[LogitsRule] = []
        if self.logit_bias:
            rules.append(LogitBias(dict(self.logit_bias), vocab))
        if self.repetition != 1 and self.window != 0:
            rules.append(Repetition(self.repetition, self.window))
        if self.presence or self.frequency:
            rules.append(OutputPenalty(self.presence, self.frequency, prompt_length))
        return tuple(rules)


class LogitBias:
    """logit += bias for each biased token id, in every row."""

    def __init__(self, bias: dict[int, float], vocab: int):
        bad = next((t for t in bias if not 0 <= t < vocab), None)
        if bad is not None:
            raise SpecdecError(f"logit_bias names token id {bad}, outside the vocabulary [0, {vocab}): "
                               "give ids of this model's tokenizer")
        self.ids = torch.tensor(sorted(bias), dtype=torch.long)
        self.values = torch.tensor([bias[t] for t in sorted(bias)], dtype=torch.float32)

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
        ids = self.ids.to(logits.device)
        logits[:, ids] += self.values.to(logits.device, logits.dtype)
        return logits


class Repetition:
    """Each token present in the row's window: a positive logit / penalty, else * penalty."""

    def __init__(self, penalty: float, window: int | None):
        self.penalty, self.window = penalty, window

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
        for j in range(logits.shape[0]):
            end = first + j
            start = 0 if self.window is None else max(0, end - self.window)
            ids = torch.unique(tokens[start:end])
            values = logits[j, ids]
            logits[j, ids] = torch.where(values <= 0, values * self.penalty, values / self.penalty)
        return logits


class OutputPenalty:
    """OpenAI's presence and frequency penalties over the generated tokens before the row (the
    tokens from `start`, the prompt's length, on)."""

    def __init__(self, presence: float, frequency: float, start: int):
        self.presence, self.frequency, self.start = presence, frequency, start

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
        for j in range(logits.shape[0]):
            ids, counts = torch.unique(tokens[self.start : first + j], return_counts=True)
            if not ids.numel():
                continue
            values = logits[j, ids]
            logits[j, ids] = values - (counts.to(values.dtype) * self.frequency + self.presence)
        return logits
