"""Prompt text -> target token ids, for plain and chat prompts."""
from __future__ import annotations

from .chat import render_for


def prompt_tokens(model, prompt: str, chat: bool = False) -> list[int]:
    """Tokenize a prompt; with chat=True wrap it as one user message in the chat template."""
    if chat:
        return chat_tokens(model, [{"role": "user", "content": prompt}])
    return model.tokenize(prompt, add_special=True, parse_special=False)


def chat_tokens(model, messages) -> list[int]:
    """Render messages with the model's template and tokenize, special tokens parsed.

    Templates that write the BOS text themselves would get a second BOS from the
    tokenizer; it is dropped.
    """
    text = render_for(model, messages)
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    bos = model.vocab.bos
    if bos is not None and len(tokens) >= 2 and tokens[0] == bos and tokens[1] == bos:
        tokens = tokens[1:]
    return tokens
