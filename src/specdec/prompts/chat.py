"""Text -> prompt token ids, with the chat template for instruct models."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ..errors import SpecdecError


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, raw: bool = False) -> list[int]:
    """Token ids for a user message; `raw` skips the chat template (base models, completions)."""
    require_text(text)
    if raw or not has_chat_template(tokenizer):
        return tokenizer(text, add_special_tokens=True)["input_ids"]
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    # transformers 5 returns a BatchEncoding here, older releases a plain list.
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer carries a chat template (an instruct model's)."""
    return bool(getattr(tokenizer, "chat_template", None))


def require_text(text: str) -> str:
    if not text.strip():
        raise SpecdecError("the prompt is empty: pass --prompt TEXT or a non-empty --prompt-file")
    return text


def encode_messages(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None,
                    head: str = "") -> list[int]:
    """Token ids for a conversation of {"role", "content"} messages (specdec serve's chat API),
    ready for the assistant's reply: the model's chat template, as encode_prompt applies it to
    one user message. A model without a template takes one user message as raw text, as
    encode_prompt does; anything longer needs a template, or the completions API.

    `tools` (OpenAI's function tool objects) go to the template as transformers passes them
    (its `tools` variable), as do assistant messages' `tool_calls` and tool messages; `head`
    is text the reply starts with, put after the template's generation prompt (a required
    tool call's opening)."""
    if not has_chat_template(tokenizer):
        if len(messages) == 1 and messages[0]["role"] == "user" and not tools and not head:
            return encode_prompt(tokenizer, messages[0]["content"], raw=True)
        raise SpecdecError("this model has no chat template: send one user message, or use /v1/completions "
                           "with the conversation formatted as the model expects")
    # Rendered, then encoded without special tokens added: what apply_chat_template(tokenize=True) does.
    text = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text + head, add_special_tokens=False)["input_ids"])
