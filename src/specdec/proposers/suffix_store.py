"""A bounded memory of token streams (earlier requests' prompts and outputs) and the match
search the suffix proposer runs over it and over the current sequence.

The streams live in one int32 buffer, each preceded by a separator (-1), so no match spans two
streams; an index sorted by token value gives every position of a token in O(log n), and a
match is extended backwards with vectorized compares that drop the candidates that stop
matching (each step shrinks the set, so a match costs about the count of the query's last
token). The buffer and index are rebuilt, lazily, after streams are added or evicted: once per
finished request, O(n log n) in numpy, against a lookup per round.

Chosen over a suffix tree or automaton: the same longest-match and continuation counts, but
4-12 bytes a token in numpy arrays instead of Python nodes, and eviction is dropping a stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SpecdecError

SEP = -1  # before every stream: a match extended backwards stops at a stream's start


@dataclass
class Occurrences:
    """Where a context occurs in one text: `ends[i]` is the position right after an occurrence
    (the token that followed it is text[ends[i]])."""

    text: np.ndarray
    ends: np.ndarray


class SuffixStore:
    """Streams of token ids, least recently used evicted first once they hold more than
    `max_tokens` tokens in all (a stream longer than that keeps its last `max_tokens`)."""

    def __init__(self, max_tokens: int = 1_000_000):
        if max_tokens < 1:
            raise SpecdecError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._streams: OrderedDict[int, np.ndarray] = OrderedDict()  # oldest use first
        self._next_id = 0
        self._tokens = 0
        self._built: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def tokens(self) -> int:
        """Tokens held, over all streams."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._streams)

    def add(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Remember a stream (a finished request's prompt and output), evicting the least
        recently used ones beyond max_tokens."""
        stream = np.asarray(tokens, dtype=np.int64).ravel()
        if stream.size and (stream.min() < 0 or stream.max() > np.iinfo(np.int32).max):
            raise SpecdecError("token ids must be non-negative 32-bit integers")
        stream = stream[-self.max_tokens :].astype(np.int32)
        if not stream.size:
            return
        self._streams[self._next_id] = stream
        self._next_id += 1
        self._tokens += stream.size
        while self._tokens > self.max_tokens:
            _, evicted = self._streams.popitem(last=False)
            self._tokens -= evicted.size
        self._built = None

    def occurrences(self, last: int) -> Occurrences:
        """Every place token `last` occurs followed by another token of its stream."""
        text, order, ordered, _, _ = self._index()
        lo, hi = np.searchsorted(ordered, [last, last + 1])
        ends = order[lo:hi] + 1
        return Occurrences(text, ends[text[ends] != SEP])

    def touch(self, ends: np.ndarray) -> None:
        """Mark the streams holding these positions of the buffer as just used."""
        if not ends.size:
            return
        _, _, _, starts, ids = self._index()
        for stream in np.unique(ids[np.searchsorted(starts, ends, side="right") - 1]):
            self._streams.move_to_end(int(stream))

    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(buffer, positions sorted by token, their tokens, each stream's first position, its id)."""
        if self._built is None:
            streams = list(self._streams.values())
            pieces = [piece for s in streams for piece in (np.full(1, SEP, np.int32), s)]
            # A trailing separator: text[end] exists for an occurrence at a stream's last token.
            text = np.concatenate([*pieces, np.full(1, SEP, np.int32)])
            sizes = np.array([s.size + 1 for s in streams], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if streams else np.zeros(0, np.int64)
            order = np.argsort(text, kind="stable").astype(np.int32)
            ids = np.fromiter(self._streams.keys(), dtype=np.int64, count=len(streams))
            self._built = (text, order, text[order], starts, ids)
        return self._built


def own_occurrences(seq: np.ndarray) -> Occurrences:
    """Every earlier place the sequence's last token occurs in the sequence itself."""
    ends = np.flatnonzero(seq[:-1] == seq[-1]) + 1
    return Occurrences(seq, ends)


def deepest(found: Occurrences, query: np.ndarray, max_depth: int) -> tuple[int, Occurrences]:
    """The longest suffix of `query` (at most max_depth tokens) that `found`'s occurrences of its
    last token extend to, and the occurrences of that suffix (depth 0: none)."""
    ends, text = found.ends, found.text
    if not ends.size:
        return 0, found
    depth = 1
    while depth < min(max_depth, query.size):
        before = ends - depth - 1
        keep = before >= 0
        keep[keep] = text[before[keep]] == query[-depth - 1]
        if not keep.any():
            break
        ends, depth = ends[keep], depth + 1
    return depth, Occurrences(text, ends)


def continuation(found: list[Occurrences], k: int, floor: float) -> tuple[list[int], float]:
    """The frequency-weighted path from the occurrences of the matched context: each step takes
    the token that most of the occurrences still on the path continue with (ties: the smallest
    id), its probability being that share of them; stops before the path's probability (the
    product) falls below `floor`, after k tokens, or when no occurrence continues. Returns the
    tokens and the expected number of them accepted if the shares hold (sum of the path's
    probabilities)."""
    tokens: list[int] = []
    path, expected = 1.0, 0.0
    while len(tokens) < k:
        alive = [_continuing(occ, len(tokens)) for occ in found]
        pooled = np.concatenate([nexts for _, nexts in alive])
        if not pooled.size:
            break
        values, counts = np.unique(pooled, return_counts=True)
        best = int(np.argmax(counts))
        share = counts[best] / pooled.size
        if path * share < floor:
            break
        path *= share
        expected += path
        token = int(values[best])
        tokens.append(token)
        found = [Occurrences(occ.text, occ.ends[nexts == token]) for occ, nexts in alive]
    return tokens, expected


def _continuing(found: Occurrences, step: int) -> tuple[Occurrences, np.ndarray]:
    """The occurrences that go on `step` tokens past their end within their stream, and the
    token each has there."""
    ends = found.ends[found.ends + step < found.text.size]
    nexts = found.text[ends + step]
    keep = nexts != SEP
    return Occurrences(found.text, ends[keep]), nexts[keep]
