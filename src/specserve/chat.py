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

# OpenAI's roles. `developer` is OpenAI's newer name for `system` and is rendered as `system`:
# templates (and the models trained on them) know `system`. `tool` and `function` messages answer
# tool calls, which this server does not support yet: they are refused, as `tools` is.
ROLES = ("system", "user", "assistant", "developer")
TOOL_ROLES = ("tool", "function")
_RENDERED_ROLE = {"developer": "system"}


class ChatTemplateError(ValueError):
    pass


class MessageError(ValueError):
    """A malformed message: `param` names the field (e.g. messages[0].role), `code` is OpenAI's."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


def _raise(message: str):
    raise ChatTemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def _content_optional(m: dict) -> bool:
    """Whether a message may leave out `content`: in OpenAI's API, an assistant message that
    carries tool calls. Tool calls are refused for now (below), so no message may yet."""
    return False


def validate_messages(messages) -> list[dict]:
    """Messages as the template gets them: {"role", "content"} with content a string.
    Raises MessageError naming the field: unknown roles, missing or non-text content."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise MessageError(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role is None:
            raise MessageError(f"Missing required parameter: 'messages[{i}].role'", f"messages[{i}].role",
                               "missing_required_parameter")
        if role in TOOL_ROLES:
            raise MessageError(f"messages[{i}]: role {role!r} answers tool calls, which this server does not "
                               "support", f"messages[{i}].role", "unsupported_parameter")
        if not isinstance(role, str) or role not in ROLES:
            shown = repr(role)[:40] if isinstance(role, str) else type(role).__name__
            raise MessageError(f"Invalid value for 'messages[{i}].role': {shown}. Supported values are: "
                               + ", ".join(repr(r) for r in ROLES) + ".", f"messages[{i}].role", "invalid_value")
        for key in ("tool_calls", "function_call"):
            if m.get(key):  # absent, null or empty: no tool call
                raise MessageError(f"messages[{i}].{key}: tool calls are not supported by this server",
                                   f"messages[{i}].{key}", "unsupported_parameter")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise MessageError(f"messages[{i}].name must be a string", f"messages[{i}].name")
        content = m.get("content")
        if content is None:
            if not _content_optional(m):
                raise MessageError(f"Missing required parameter: 'messages[{i}].content'",
                                   f"messages[{i}].content", "missing_required_parameter")
            content = ""
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            texts = []
            for j, p in enumerate(content):
                if isinstance(p, dict) and p.get("type") == "text":
                    if not isinstance(p.get("text"), str):
                        raise MessageError(f"messages[{i}].content[{j}].text must be a string",
                                           f"messages[{i}].content[{j}].text")
                    texts.append(p["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise MessageError(f"messages[{i}].content must be a string or an array of content parts",
                               f"messages[{i}].content")
        out.append({"role": _RENDERED_ROLE.get(role, role), "content": content})
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
