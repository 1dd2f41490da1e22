"""Long prompts of an exact token count built from real text: news articles from Spec-Bench's
summarization set (bundled, data/README.md), followed by a question about them.

The article text is real, so drafts and n-gram lookup see what they would see on a user's long
document, unlike random tokens, which no proposer can guess.
"""

from __future__ import annotations

import json
from importlib.resources import files

from transformers import PreTrainedTokenizerBase

from .errors import SpecdecError

QUESTION = "\n\nSummarize the last article above in three sentences."
_MARK = "\x00DOCUMENTS\x00"


def articles() -> list[str]:
    """The bundled news articles, in file order."""
    text = files("specdec").joinpath("data/spec_bench_question.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r["turns"][0].removeprefix("Summarize: ") for r in rows if r["category"] == "summarization"]


def long_prompt(tokenizer: PreTrainedTokenizerBase, n_tokens: int, raw: bool = False) -> list[int]:
    """Exactly `n_tokens` prompt ids: chat template (unless `raw`) around numbered articles,
    the last one cut to fit, and the question."""
    pre, post = _template(tokenizer, raw)
    head = tokenizer(pre, add_special_tokens=raw)["input_ids"]
    tail = tokenizer(QUESTION + post, add_special_tokens=False)["input_ids"]
    room = n_tokens - len(head) - len(tail)
    if room < 16:
        raise SpecdecError(f"a long prompt needs at least {len(head) + len(tail) + 16} tokens, got {n_tokens}")
    body: list[int] = []
    for number, article in enumerate(articles(), 1):
        if len(body) >= room:
            break
        body += tokenizer(f"{'' if number == 1 else chr(10) * 2}Article {number}:\n{article}",
                          add_special_tokens=False)["input_ids"]
    if len(body) < room:
        raise SpecdecError(
            f"the bundled articles make prompts of at most {len(head) + len(tail) + len(body)} tokens, "
            f"asked for {n_tokens}"
        )
    return head + body[:room] + tail


def _template(tokenizer: PreTrainedTokenizerBase, raw: bool) -> tuple[str, str]:
    """The text before and after the user's message in the chat template."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return "", ""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=True,
                                         tokenize=False)
    pre, post = text.split(_MARK)
    return pre, post
