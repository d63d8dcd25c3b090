"""The generic call form: tools for a template that spells no call specserve reads, as llama-server's "generic".

A template without tool support (SmolLM2's ChatML, Gemma's) or with a call form not read here gets
what llama-server's generic format gives it: the tools are described in the system message with an
instruction to answer in JSON, and the whole answer is one JSON object, constrained by the grammar:

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"tool_calls": [{"name": ..., "arguments": ...}, ...]}      (parallel_tool_calls)
    {"response": "It is sunny in Paris."}                         (tool_choice "auto": a reply)

read back by genericcalls.py into calls or content. The layout is fixed (json.dumps's), so the
wrapper and each tool's name are forced tokens (drafted for free) and the reader knows where a call
ends. The template renders neither tools nor calls, so the conversation goes to it rewritten
(`generic_chat`, as llama.cpp's template polyfills do): a past call is the assistant's JSON in this
form, a tool's result a user message `{"tool_response": {"tool": NAME, "content": ...}}`.
"""
from __future__ import annotations

import json

from ....chat import validate_messages

RESPONSE, CALL, CALLS = '{"response": ', '{"tool_call": ', '{"tool_calls": ['


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def generic_lark(names: tuple[str, ...], schemas: list[dict], choice: str, parallel: bool) -> str:
    """The Lark grammar of an answer in the generic form under this choice ("auto", "required" or a
    tool's name; "none" has no grammar: the answer is text)."""
    lines = []
    for i, (name, schema) in enumerate(zip(names, schemas)):
        head = _lit('{"name": ' + _lit(name) + ', "arguments": ')
        lines.append(f'call_{i}: {head} args_{i} "}}"')
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(names))))
    if parallel:
        lines.append(f'calls: {_lit(CALLS)} call (", " call)* "]}}"')
    else:
        lines.append(f'calls: {_lit(CALL)} call "}}"')
    lines.append(f'response: {_lit(RESPONSE)} reply "}}"')
    lines.append('reply: %json {"type": "string"}')
    if choice == "auto":
        start = "response | calls"
    elif choice == "required":
        start = "calls"
    else:  # a named function: exactly one call of it
        start = f'{_lit(CALL)} call_{names.index(choice)} "}}"'
    return "\n".join([f"start: {start}", *lines]) + "\n"


def instruction(tools: list[dict], choice: str, parallel: bool) -> str:
    """What the system message says of the tools: llama-server's words (its template polyfill's and its
    generic format's), with the JSON the grammar allows spelled out."""
    call = '{"name": "<tool name>", "arguments": {<its arguments>}}'
    calls = f'{{"tool_calls": [{call}, ...]}}' if parallel else f'{{"tool_call": {call}}}'
    reply = '{"response": "<your reply>"}'
    field = "tool_calls" if parallel else "tool_call"
    if choice == "auto":
        how = (f"Respond in JSON format, either with `{field}` (a request to call tools) or with `response` "
               f"(a reply to the user's request): {calls} or {reply}")
    elif choice == "required":
        how = f"Respond in JSON format with `{field}` (a request to call tools): {calls}"
    else:
        named = call.replace("<tool name>", choice)
        how = f'Respond in JSON format with `tool_call`, calling {choice}: {{"tool_call": {named}}}'
    return ("You can call any of the following tools to satisfy the user's requests: "
            + json.dumps(tools, indent=2, ensure_ascii=False) + "\n\n" + how)


def generic_chat(messages, tools: list | None, choice: str, parallel: bool, template: str) -> list[dict]:
    """The chat as a template without tool support can render it: past calls and results written in
    the generic form, and (where calls may be made) the tools and the answer's form in the system
    message, or in the first user message where the template has no system role. Raises MessageError."""
    msgs = validate_messages(messages)
    named: dict = {}  # call id -> function name, for the results
    out: list[dict] = []
    for m in msgs:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            named.update((c.get("id"), c["function"]["name"]) for c in m["tool_calls"])
            text = json.dumps({"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}, ensure_ascii=False)
            out.append({"role": "assistant", "content": f"{m['content']}\n{text}" if m["content"] else text})
        elif m["role"] == "tool":
            name = m.get("name") or named.get(m["tool_call_id"])
            result = {"tool": name, "content": m["content"]} if name else {"content": m["content"]}
            out.append({"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)})
        else:
            out.append(m)
    if not tools or choice == "none":
        return out
    said = instruction(tools, choice, parallel)
    if out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{said}" if out[0]["content"] else said}
    elif "System role not supported" not in template:
        out.insert(0, {"role": "system", "content": said})
    else:  # Gemma 2's template raises on a system message: the first user message carries it
        first = next((i for i, m in enumerate(out) if m["role"] == "user"), 0)
        out[first] = {**out[first], "content": f"{said}\n\n{out[first]['content']}"}
    return out
