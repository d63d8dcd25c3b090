"""llama-server's other paths for the same endpoints: /chat/completions (OpenAI chat), /completions
(llama-server's own /completion, not OpenAI's), /models."""
from __future__ import annotations

from ...http.endpoint import Endpoint
from ..openai import chat as openai_chat, completions as openai_completions
from . import completion as llama


def routes() -> list[Endpoint]:
    return [Endpoint("/chat/completions", openai_chat.chat_completions),
            Endpoint("/completions", llama.completion),
            Endpoint("/models", openai_completions.models, ("GET",), needs_model=False)]
