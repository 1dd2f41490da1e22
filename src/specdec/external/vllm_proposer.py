"""specdec's prompt lookup as a vLLM proposer (vLLM's `custom_class` speculative method): a vLLM
server that drafts with specdec's own n-gram search, verified by vLLM as any proposer is.

    --speculative-config '{"method": "custom_class", "model": "specdec.external.vllm_proposer.Lookup",
                           "num_speculative_tokens": 4, "prompt_lookup_max": 3}'

vLLM imports the class in its worker process (VllmServer puts specdec's source on that
process's path for this method), builds it from its VllmConfig, and each step calls `propose`
with every running request's newly sampled tokens and its token ids so far; a request gets no
guesses where it sampled nothing this step (it is still prefilling) or is at the length limit.
specdec's lookup tries n-grams from `prompt_lookup_max` down to 1, as vLLM's own does; they
differ in which match they copy from (specdec: the latest with a full k-token continuation).
"""

from __future__ import annotations

import numpy as np
import torch

from ..decode.sampling import SamplingConfig
from ..proposers.lookup import PromptLookup

GREEDY = SamplingConfig(0.0)
DEFAULT_NGRAM = 3


class Lookup:
    """What vLLM's custom_class proposer must be: built from a VllmConfig, with `propose`."""

    def __init__(self, vllm_config) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.lookup = PromptLookup(self.k, int(spec.prompt_lookup_max or DEFAULT_NGRAM))
        self.max_model_len = int(vllm_config.model_config.max_model_len)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner calls this on every drafter; prompt lookup has no model."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """Up to k guesses per running request, from its token ids so far."""
        drafts = []
        for i, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[i])
            if not sampled or length >= self.max_model_len:
                drafts.append([])
                continue
            k = min(self.k, self.max_model_len - length)
            seq = torch.from_numpy(np.asarray(token_ids_cpu[i, :length], dtype=np.int64))
            drafts.append(self.lookup.propose(seq, k, GREEDY, None).tokens.tolist())
        return drafts
