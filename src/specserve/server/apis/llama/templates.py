"""llama-server's token and template endpoints: POST /tokenize, /detokenize, /apply-template and
/v1/chat/completions/input_tokens, in its shapes.

/tokenize: `content` (a string, or a mix of strings and token ids), `add_special` (default false),
`parse_special` (default true: `<|im_start|>` written in the text is that control token),
`with_pieces` (each token's text, or its bytes where the text is not whole UTF-8). /detokenize:
`tokens` -> `content`, control tokens written out. /apply-template: a chat body (`messages`, `tools`,
`tool_choice`, `add_generation_prompt`) -> the prompt text the chat template makes of it, without
generating (llama.vscode's agent reads it). input_tokens: how many prompt tokens a chat body is.
The token endpoints read the body and build their answers off the event loop: both grow with the request.
"""
from __future__ import annotations

import json

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....chat import ChatTemplateError, MessageError, render, validate_messages
from ....prompt import chat_tokens
from ...core.constraints.tools import template_input
from ...core.assistant_prefill import prefill_joined, prefilled
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...state import server_of
from ..shared.generation_fields import template_kwargs_of
from ..shared.validation import parse
from .protocol import DetokenizeRequest, TemplateRequest, TokenizeRequest


def routes() -> list[Endpoint]:
    return [Endpoint("/tokenize", tokenize), Endpoint("/detokenize", detokenize),
            Endpoint("/apply-template", apply_template),
            Endpoint("/chat/completions/input_tokens", input_tokens),
            Endpoint("/v1/chat/completions/input_tokens", input_tokens)]


def tokenize_mixed(model, content, add_special: bool, parse_special: bool, param: str = "content") -> list[int]:
    """llama-server's mixed prompt: a string, token ids, or both in one list (each string tokenized on its
    own, special tokens added before the first piece only). 400 naming `param` otherwise."""
    pieces = [content] if isinstance(content, str) else content
    if not isinstance(pieces, list):
        raise bad_request(f"{param} must be a string or an array of strings and token ids", param)
    out: list[int] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            out += model.tokenize(piece, add_special=add_special and i == 0, parse_special=parse_special)
        elif isinstance(piece, int) and not isinstance(piece, bool):
            if not 0 <= piece < model.vocab.n_vocab:
                raise bad_request(f"token id {piece} is outside the vocabulary [0, {model.vocab.n_vocab})",
                                  f"{param}[{i}]")
            out.append(piece)
        else:
            raise bad_request(f"{param}[{i}] must be a string or a token id", f"{param}[{i}]")
    return out


def _piece(model, token: int):
    """A token's text (control tokens written out), or its bytes where they are not whole UTF-8."""
    raw = model.token_bytes(token, True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _json(obj) -> bytes:
    """JSONResponse's bytes (compact, UTF-8), made where the caller runs: off the event loop for a large answer."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


JSON_SLICE = 4096  # items a json.dumps call encodes: it holds the interpreter lock until it returns


def _json_list(key: str, items: list) -> bytes:
    """_json({key: items}), encoded a slice at a time. One json.dumps call over 600k pieces held the
    interpreter lock, and so the event loop, for its whole run, in a worker thread as much as on the loop
    (/health waited 0.7-0.8 s beside one such request, up to 1.7 s in issue 63's storm); between slices the loop
    gets its turn (0.08-0.3 s)."""
    slices = (_json(items[i:i + JSON_SLICE])[1:-1] for i in range(0, len(items), JSON_SLICE))
    return b"{" + _json(key) + b":[" + b",".join(slices) + b"]}"


async def tokenize(request: Request) -> Response:
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    model = state.engine.target

    def answer() -> bytes:  # off the event loop: 600k pieces took it 0.6 s
        fields = parse(TokenizeRequest, body)
        if fields.content is None:
            return _json({"tokens": []})
        tokens = tokenize_mixed(model, fields.content, fields.add_special, fields.parse_special)
        if fields.with_pieces:
            return _json_list("tokens", [{"id": t, "piece": _piece(model, t)} for t in tokens])
        return _json_list("tokens", tokens)
    return Response(await anyio.to_thread.run_sync(answer), media_type="application/json")


async def detokenize(request: Request) -> Response:
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    model = state.engine.target

    def answer() -> bytes:  # off the event loop: a million ids took it 0.25 s
        fields = parse(DetokenizeRequest, body)
        bad = [t for t in fields.tokens if not 0 <= t < model.vocab.n_vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {model.vocab.n_vocab})", "tokens")
        text = b"".join(model.token_bytes(t, True) for t in fields.tokens)
        return _json({"content": text.decode("utf-8", "replace")})
    return Response(await anyio.to_thread.run_sync(answer), media_type="application/json")


def render_chat(model, messages: list, tools: list | None, add_generation_prompt: bool | None = None,
                continue_final: bool | None = None, template_kwargs: dict | None = None) -> str:
    """The prompt text the model's chat template makes of a chat (a continued last message ends the text)."""
    try:
        msgs = validate_messages(messages)
    except MessageError as e:
        raise bad_request(str(e), e.param, e.code) from None
    v = model.vocab
    bos = v.token_texts[v.bos] if v.bos is not None else ""
    eos = v.token_texts[v.eos] if v.eos is not None else ""
    cont = prefilled(msgs, add_generation_prompt, continue_final)
    try:
        # the messages as sent, as a chat request gives them: validated messages hold parsed tool-call
        # arguments, which a second validation (the generic form's) takes only where they are objects
        msgs, tools = template_input(model, prefill_joined(messages, cont), tools)
        return render(msgs, model.metadata.get("tokenizer.chat_template"), bos, eos,
                      add_generation_prompt=add_generation_prompt is not False, tools=tools,
                      continue_final=cont, template_kwargs=template_kwargs)
    except MessageError as e:
        raise bad_request(str(e), e.param, e.code) from None
    except ChatTemplateError as e:
        raise bad_request(str(e), "messages") from None


async def _template_request(request: Request):
    """(state, fields, template kwargs) of a body that names a chat to render (/apply-template, input_tokens)."""
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    fields = parse(TemplateRequest, body)
    if not fields.messages:
        raise bad_request("messages must be a non-empty array", "messages")
    return state, fields, template_kwargs_of(fields.chat_template_kwargs, state.settings.template_kwargs)


async def apply_template(request: Request) -> Response:
    state, fields, kwargs = await _template_request(request)
    prompt = await anyio.to_thread.run_sync(render_chat, state.engine.target, fields.messages, fields.tools or None,
                                            fields.add_generation_prompt, fields.continue_final_message, kwargs)
    return JSONResponse({"prompt": prompt})


async def input_tokens(request: Request) -> Response:
    state, fields, kwargs = await _template_request(request)

    def count() -> int:
        try:
            model = state.engine.target
            return len(chat_tokens(model, *template_input(model, fields.messages, fields.tools or None),
                                   template_kwargs=kwargs))
        except MessageError as e:
            raise bad_request(str(e), e.param, e.code) from None
        except (ChatTemplateError, ValueError) as e:
            raise bad_request(str(e), "messages") from None
    return JSONResponse({"input_tokens": await anyio.to_thread.run_sync(count)})
