"""Chat messages -> prompt text, with the chat template stored in the GGUF metadata."""
from __future__ import annotations

import datetime
import json
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model carries no template: ChatML, which SmolLM2 and many others speak.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# OpenAI's roles. `developer` is OpenAI's newer name for `system` and is rendered as `system`:
# templates (and the models trained on them) know `system`. `tool` messages answer tool calls;
# `function` ones (the deprecated form before tools) are refused.
ROLES = ("system", "user", "assistant", "developer", "tool")
TOOL_ROLES = ("function",)
_RENDERED_ROLE = {"developer": "system"}


# what the renderer itself gives a template: template_kwargs cannot replace them
TEMPLATE_OWN = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


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


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """Hugging Face's `tojson`, which templates are written against: keys in their order, no HTML
    escaping (Jinja's own sorts keys and spells `<` as `\\u003c`, so a tool call in the history would
    not read as the model wrote it)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    # loopcontrols: {% break %} and {% continue %}, which Hugging Face's renderer takes too (Command R7B's template)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    # Hugging Face's: templates that write today's date (Llama 3.x) call it
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def _content_optional(m: dict) -> bool:
    """Whether a message may leave out `content`: in OpenAI's API, an assistant message that
    carries tool calls."""
    return m.get("role") == "assistant" and bool(m.get("tool_calls"))


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant's tool_calls as templates read them (Hugging Face's convention): `arguments`
    as an object, which the template renders with `tojson`."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise MessageError(f"{where} must be an array", where)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments"), dict):
            out.append(c)  # validated before (render validates again): arguments parsed already
            continue
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise MessageError(f"{where}[{j}] must be {{\"id\", \"type\": \"function\", \"function\": "
                               "{\"name\": string, \"arguments\": string}}", f"{where}[{j}]")
        try:
            arguments = json.loads(f["arguments"])
        except ValueError:
            raise MessageError(f"{where}[{j}].function.arguments is not valid JSON", f"{where}[{j}].function.arguments",
                               "invalid_value") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": arguments}})
    return out


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
            raise MessageError(f"messages[{i}]: role {role!r} answers the deprecated function calls, which this "
                               "server does not support; use tools and role 'tool'", f"messages[{i}].role",
                               "unsupported_parameter")
        if not isinstance(role, str) or role not in ROLES:
            shown = repr(role)[:40] if isinstance(role, str) else type(role).__name__
            raise MessageError(f"Invalid value for 'messages[{i}].role': {shown}. Supported values are: "
                               + ", ".join(repr(r) for r in ROLES) + ".", f"messages[{i}].role", "invalid_value")
        if m.get("function_call"):  # absent, null or empty: no call
            raise MessageError(f"messages[{i}].function_call: the deprecated function calls are not supported; "
                               "use tools and tool_calls", f"messages[{i}].function_call", "unsupported_parameter")
        if m.get("tool_calls") and role != "assistant":
            raise MessageError(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                               f"messages[{i}].tool_calls")
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise MessageError(f"Missing required parameter: 'messages[{i}].tool_call_id'",
                               f"messages[{i}].tool_call_id", "missing_required_parameter")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise MessageError(f"messages[{i}].name must be a string", f"messages[{i}].name")
        content = m.get("content")
        if content is None:
            if not _content_optional(m):
                raise MessageError(f"Missing required parameter: 'messages[{i}].content'",
                                   f"messages[{i}].content", "missing_required_parameter")
            content = ""
        if isinstance(content, list):  # OpenAI content parts: the text ones, a line each (llama-server's, vLLM's)
            texts = []
            for j, p in enumerate(content):
                if isinstance(p, dict) and p.get("type") == "text":
                    if not isinstance(p.get("text"), str):
                        raise MessageError(f"messages[{i}].content[{j}].text must be a string",
                                           f"messages[{i}].content[{j}].text")
                    texts.append(p["text"])
            content = "\n".join(texts)
        if not isinstance(content, str):
            raise MessageError(f"messages[{i}].content must be a string or an array of content parts",
                               f"messages[{i}].content")
        msg = {"role": _RENDERED_ROLE.get(role, role), "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
            msg["reasoning_content"] = m["reasoning_content"]  # reasoning templates render it (Qwen3's: late turns)
        if role == "tool":
            msg["tool_call_id"] = m["tool_call_id"]
            if m.get("name") is not None:
                msg["name"] = m["name"]
        out.append(msg)
    return out


def render(messages, template: str | None, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True, tools: list | None = None, continue_final: bool = False,
           template_kwargs: dict | None = None) -> str:
    """Render messages with the model's template (ChatML when it has none); `tools` (OpenAI's
    request field) go to the template as Hugging Face passes them. `continue_final`: the last message
    (the assistant's) is continued, not closed: the text ends where its content ends (llama-server's
    assistant prefill, vLLM's continue_final_message). `template_kwargs`: more variables for the
    template (llama-server's and vLLM's chat_template_kwargs: `enable_thinking`, ...)."""
    msgs = validate_messages(messages)
    # what llama-server gives every template: today (Llama 3.x's write it, firefunction's reads `datetime`)
    # and enable_thinking, true unless turned off (--reasoning off, or chat_template_kwargs)
    now = datetime.datetime.now()
    extra = {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"), "enable_thinking": True,
             **{k: v for k, v in (template_kwargs or {}).items() if k not in TEMPLATE_OWN}}
    if tools:
        extra["tools"] = tools
    if template and " functools[" in template:  # firefunction v2's reads its tools as `functions` (llama-server's)
        extra.setdefault("functions", json.dumps(tools, indent=2, ensure_ascii=False) if tools else "")
    try:
        text = _compile(template or CHATML).render(
            messages=msgs, add_generation_prompt=add_generation_prompt and not continue_final, bos_token=bos_token,
            eos_token=eos_token, **extra)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template failed: {e}") from e
    if continue_final:
        content = msgs[-1]["content"]
        end = text.rfind(content) if content else -1
        if msgs[-1]["role"] != "assistant" or end < 0:
            raise ChatTemplateError("the last message cannot be continued: it is not the assistant's, or the chat "
                                    "template does not write its content as it is")
        text = text[:end + len(content)]
    return text


def render_for(model, messages, tools: list | None = None, continue_final: bool = False,
               template_kwargs: dict | None = None) -> str:
    """Render for a loaded model, using its template and special token texts."""
    v = model.vocab
    bos = v.token_texts[v.bos] if v.bos is not None else ""
    eos = v.token_texts[v.eos] if v.eos is not None else ""
    return render(messages, model.metadata.get("tokenizer.chat_template"), bos, eos, tools=tools,
                  continue_final=continue_final, template_kwargs=template_kwargs)
