"""The chat prefill rules, the same on every API that takes a chat: a chat that ends with the assistant's
message continues that message (the answer begins where it stops) instead of opening a new turn."""
from __future__ import annotations

from ..http.errors import bad_request


def prefilled(msgs: list[dict], add_generation_prompt: bool | None, continue_final: bool | None) -> bool:
    """Whether the chat continues its last (assistant) message instead of opening a new turn: asked with
    `continue_final_message`, or, as llama-server does, a chat that ends with an assistant message."""
    if continue_final and add_generation_prompt:
        raise bad_request("add_generation_prompt and continue_final_message cannot both be true",
                          "continue_final_message")
    last = msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls") and bool(msgs[-1]["content"])
    if last and continue_final is not False and len(msgs) > 1 and msgs[-2]["role"] == "assistant":
        raise bad_request("a chat cannot end with two assistant messages: the last is continued, so the one "
                          "before it would have no turn after it", f"messages[{len(msgs) - 1}]")
    if continue_final and not last:
        raise bad_request("continue_final_message needs a last message from the assistant", "continue_final_message")
    return bool(continue_final) or (continue_final is None and last)


def prefill_joined(messages: list, continue_final: bool) -> list:
    """The chat with a continued last message's text parts joined by a blank line, as llama-server joins
    them (a part of any other message is a line of its own: chat.validate_messages)."""
    content = messages[-1].get("content") if continue_final and isinstance(messages[-1], dict) else None
    if not isinstance(content, list):
        return messages
    texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return [*messages[:-1], {**messages[-1], "content": "\n\n".join(texts)}]
