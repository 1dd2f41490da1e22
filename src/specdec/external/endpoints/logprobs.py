"""The tokens of a streamed chunk from its logprobs, in both layouts OpenAI-compatible servers
write: each token's id where the server gives one (llama.cpp's `id`, vLLM's `token_id:N`), its
text, and its alternatives best first."""

from __future__ import annotations

Top = list[tuple[int | str, float]]  # one position's alternatives, best first: (id, or text where no id; logprob)


def token_entries(logprobs: dict | None) -> list[tuple[int | None, str, Top]]:
    """(token id or None, its text, its alternatives) per token of a chunk, in both layouts
    servers use: `content` entries (chat; llama.cpp everywhere) or the completions API's parallel
    lists (vLLM spells a token `token_id:N` there, its text is then unknown: "")."""
    if not logprobs:
        return []
    if "content" in logprobs:
        return [(_id(e), _piece(e.get("token")), _best_first([(_key(a), float(a["logprob"]))
                                                              for a in e.get("top_logprobs") or []]))
                for e in logprobs["content"] or []]
    tokens = logprobs.get("tokens") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    return [(_token_id(t), _piece(t), _best_first([(_token_id(k) if _token_id(k) is not None else k, float(v))
                                                   for k, v in (top or {}).items()]))
            for t, top in zip(tokens, tops)]


def _piece(token) -> str:
    return "" if not isinstance(token, str) or _token_id(token) is not None else token


def _best_first(top: Top) -> Top:
    return sorted(top, key=lambda pair: -pair[1])


def _key(entry: dict) -> int | str:
    token_id = _id(entry)
    return token_id if token_id is not None else entry.get("token", "")


def _id(entry: dict) -> int | None:
    if isinstance(entry.get("id"), int):
        return entry["id"]
    return _token_id(entry.get("token"))


def _token_id(token) -> int | None:
    """vLLM's `token_id:N` spelling, else None."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            return None
    return None
