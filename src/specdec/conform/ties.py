"""Comparing a speculative output with a reference decoding, and explaining differences.

Against specdec's own plain decoding no difference is allowed: the target's forward is
block-invariant (runtime.hf.prepare), so a token's logits do not depend on how many tokens were
verified with it. Against another engine (transformers' generate, llama.cpp) kernels differ, so
outputs can part where the target's top two logits (nearly) tie; such a difference is explained
by the gap at the first differing token, taken from a fresh forward of the common prefix, and
reported with it, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

# Logit-gap tolerance by dtype: a few units in the last place of the logits' magnitude (~20).
NEAR_TIE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.1}


def tie_kind(gap: float | None, tolerance: float) -> str:
    """How a difference at a position whose two best tokens are `gap` apart is explained: an
    exact tie, a near-tie (below `tolerance`: another kernel may round either way), or not a tie;
    without a gap (a server that gave no top logprobs) nothing is explained."""
    if gap is None:
        return "gap unknown"
    return "exact tie" if gap == 0 else "near-tie" if gap < tolerance else "not a tie"


@dataclass
class Difference:
    position: int  # index into the new tokens of the first difference
    expected: int  # plain decoding's token
    got: int  # speculative token
    gap: float  # target's top-1 minus top-2 logit there
    tolerance: float

    @property
    def near_tie(self) -> bool:
        return self.gap < self.tolerance

    @property
    def kind(self) -> str:
        return tie_kind(self.gap, self.tolerance)

    def describe(self) -> str:
        return (f"first difference at new token {self.position} ({self.expected} vs {self.got}), "
                f"top-1/top-2 logit gap {self.gap:.4g}: {self.kind} (tolerance {self.tolerance:g})")


def first_difference(
    target: PreTrainedModel, prompt: list[int], reference: list[int], candidate: list[int]
) -> Difference | None:
    """None when `candidate` equals `reference` (or is its prefix ending at the same EOS)."""
    pos = next((i for i, (a, b) in enumerate(zip(reference, candidate)) if a != b), None)
    if pos is None:
        if len(reference) == len(candidate):
            return None
        pos = min(len(reference), len(candidate))
    expected = reference[pos] if pos < len(reference) else -1
    got = candidate[pos] if pos < len(candidate) else -1
    ids = torch.tensor([prompt + reference[:pos]], device=target.device)
    with torch.inference_mode():
        logits = target(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    tol = NEAR_TIE_TOLERANCE.get(target.dtype, 0.5)
    return Difference(pos, expected, got, float(top[0] - top[1]), tol)
