"""Long prompts of an exact token count built from real text: news articles from Spec-Bench's
summarization set (bundled, data/README.md), and a request to summarise the last one.

The last article and the request are the same at every length; only the earlier articles in
front of them grow (cut at their start to fit), so runs at 2K, 4K and 8K tokens ask the same
question and differ only in how much context precedes it. The text is real, so drafts and
n-gram lookup see what they would see in a user's long document, unlike random tokens.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ..errors import SpecdecError
from .datasets import dataset_path, read_prompts

QUESTION = "\n\nSummarize the last article above in three sentences."
_MARK = "\x00DOCUMENTS\x00"


def articles() -> list[str]:
    """The bundled news articles, in file order."""
    prompts = read_prompts(dataset_path("spec-bench"))
    return [p.text.removeprefix("Summarize: ") for p in prompts if p.category == "summarization"]


def long_prompt(tokenizer: PreTrainedTokenizerBase, n_tokens: int, raw: bool = False) -> list[int]:
    """Exactly `n_tokens` prompt ids: chat template (unless `raw`) around earlier articles (cut
    at the front to fit), the last article (the shortest bundled one, so short prompts fit) and
    the request."""
    docs = articles()
    last = min(docs, key=len)
    pre, post = _template(tokenizer, raw)
    head = tokenizer(pre, add_special_tokens=raw)["input_ids"]
    fixed = tokenizer(f"\n\nLast article:\n{last}", add_special_tokens=False)["input_ids"]
    tail = tokenizer(QUESTION + post, add_special_tokens=False)["input_ids"]
    room = n_tokens - len(head) - len(fixed) - len(tail)
    if room < 0:
        raise SpecdecError(f"a long prompt needs at least {n_tokens - room} tokens, got {n_tokens}")
    earlier: list[int] = []
    for doc in reversed([d for d in docs if d is not last]):  # nearest to the last article first
        if len(earlier) >= room:
            break
        earlier = tokenizer(f"\n\n{doc}", add_special_tokens=False)["input_ids"] + earlier
    if len(earlier) < room:
        raise SpecdecError(
            f"the bundled articles make prompts of at most {n_tokens - room + len(earlier)} tokens, "
            f"asked for {n_tokens}"
        )
    return head + earlier[len(earlier) - room :] + fixed + tail


def _template(tokenizer: PreTrainedTokenizerBase, raw: bool) -> tuple[str, str]:
    """The text before and after the user's message in the chat template."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return "", ""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=True,
                                         tokenize=False)
    pre, post = text.split(_MARK)
    return pre, post
