"""A cheaper draft: an output layer restricted to the most frequent token ids.

A 0.5B draft with a 152K-token vocabulary spends about a quarter of each step in its output
layer. Scoring only the N most frequent ids cuts that part by vocab/N. Lossless all the same:
the draft then proposes only those ids (its q is 0 elsewhere), the target still scores the whole
vocabulary, and on a rejection the residual (p - q)+ covers every other token.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ..errors import SpecdecError
from ..runtime.hf.model_facts import HEAD_IDS, PREPARED_FIX, is_prepared

if TYPE_CHECKING:  # the native path picks a draft's frequent ids without transformers' model classes
    from transformers import PreTrainedModel


def restrict_head(model: PreTrainedModel, keep: torch.Tensor) -> PreTrainedModel:
    """Replace `model`'s output layer, in place, by one with only the rows of the token ids in
    `keep`; returns the model, which then carries those ids (sorted) as `HEAD_IDS`."""
    if is_prepared(model):
        raise SpecdecError(f"this model {PREPARED_FIX}")
    head = model.get_output_embeddings()
    if getattr(model, HEAD_IDS, None) is not None:
        raise SpecdecError("this draft's head is already restricted")
    if not isinstance(head, torch.nn.Linear):
        raise SpecdecError("restrict the draft's head before quantizing it (--draft-vocab applies first)")
    keep = torch.unique(keep.to(head.weight.device))
    if keep.numel() == 0 or int(keep.min()) < 0 or int(keep.max()) >= head.out_features:
        raise SpecdecError(f"head token ids must lie in [0, {head.out_features}) and not be empty")
    small = torch.nn.Linear(head.in_features, keep.numel(), bias=head.bias is not None,
                            device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        small.weight.copy_(head.weight[keep])
        if head.bias is not None:
            small.bias.copy_(head.bias[keep])
    model.set_output_embeddings(small)
    setattr(model, HEAD_IDS, keep)
    return model


def frequent_tokens(token_lists: Iterable[list[int]], n: int, vocab_size: int,
                    always: Iterable[int] = ()) -> torch.Tensor:
    """The `n` token ids to keep: `always` (e.g. the special tokens), then the ids seen in
    `token_lists` by falling count, then unseen ids in increasing order (byte-pair vocabularies
    number their merges roughly by frequency, so low ids are the common ones)."""
    if not 0 < n <= vocab_size:
        raise SpecdecError(f"the draft vocabulary size must lie in [1, {vocab_size}], got {n}")
    counts = Counter(t for tokens in token_lists for t in tokens if 0 <= t < vocab_size)
    order = [t for t in dict.fromkeys(always) if 0 <= t < vocab_size]
    order += [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    chosen = list(dict.fromkeys(order))[:n]
    if len(chosen) < n:
        taken = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in taken][: n - len(chosen)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def bundled_text_tokens(tokenizer) -> list[list[int]]:
    """The bundled Spec-Bench prompts (13 task kinds, 480 prompts) as token lists: the real text
    on which the default frequencies are counted."""
    from ..prompts.datasets import dataset_path, read_prompts

    return [tokenizer(p.text, add_special_tokens=False)["input_ids"]
            for p in read_prompts(dataset_path("spec-bench"))]


def frequent_head_ids(tokenizer, n: int, width: int) -> torch.Tensor:
    """The `n` most frequent ids of the bundled text among the `width` a head scores (see above).
    Counted once per tokenizer that names its source and kept in the model cache: tokenizing the
    480 prompts took 0.2 s of a 3 s warm start. A stale entry (a folder's tokenizer replaced in
    place) would only change which ids the draft may propose, never what is generated."""
    if not tokenizer.name_or_path:  # nothing to know it by again
        return _counted_head_ids(tokenizer, n, width)
    from ..files import cache_root, read_json, write_json_atomic
    from ..prompts.datasets import dataset_path

    data = dataset_path("spec-bench").stat()
    key = json.dumps([tokenizer.name_or_path, len(tokenizer), sorted(tokenizer.all_special_ids), n, width,
                      data.st_size, data.st_mtime_ns])
    path = cache_root() / "head-ids" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    if path.is_file():
        saved = read_json(path)
        if saved.get("key") == key:
            return torch.tensor(saved["ids"], dtype=torch.long)
    ids = _counted_head_ids(tokenizer, n, width)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": key, "ids": ids.tolist()})
    return ids


def _counted_head_ids(tokenizer, n: int, width: int) -> torch.Tensor:
    return frequent_tokens(bundled_text_tokens(tokenizer), n, min(width, len(tokenizer)),
                           always=tokenizer.all_special_ids)


def restrict_to_frequent(model: PreTrainedModel, tokenizer, n: int) -> PreTrainedModel:
    """Restrict `model`'s head to the `n` most frequent ids of the bundled text."""
    return restrict_head(model, frequent_head_ids(tokenizer, n, model.get_output_embeddings().out_features))
