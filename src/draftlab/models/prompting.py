"""Turn a user prompt (or a conversation) into token ids, through the chat template when asked."""

from __future__ import annotations

from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel

Message = dict[str, str]


def has_chat_template(lm: LoadedModel) -> bool:
    return bool(getattr(lm.tokenizer, "chat_template", None)) and not lm.is_encoder_decoder


def encode_prompt(lm: LoadedModel, prompt: str | list[Message], chat: bool) -> list[int]:
    """`prompt` is plain text or a list of chat messages ending with a user turn."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not messages or not any(m["content"].strip() for m in messages):
        raise DraftlabError("empty prompt")
    if chat and has_chat_template(lm):
        ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    # No template (or --no-chat): the conversation is plain text, turn after turn.
    text = "\n\n".join(m["content"] for m in messages)
    return list(lm.tokenizer(text)["input_ids"])
