"""Chat messages -> prompt text, with the chat template stored in the GGUF metadata."""
from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model carries no template: ChatML, which SmolLM2 and many others speak.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    pass


def _raise(message: str):
    raise ChatTemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def validate_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            content = "".join(parts)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": content})
    return out


def render(messages, template: str | None, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True) -> str:
    """Render messages with the model's template (ChatML when it has none)."""
    msgs = validate_messages(messages)
    try:
        return _compile(template or CHATML).render(
            messages=msgs, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template failed: {e}") from e


def render_for(model, messages) -> str:
    """Render for a loaded model, using its template and special token texts."""
    v = model.vocab
    bos = v.token_texts[v.bos] if v.bos is not None else ""
    eos = v.token_texts[v.eos] if v.eos is not None else ""
    return render(messages, model.metadata.get("tokenizer.chat_template"), bos, eos)
