"""Anthropic Messages and OpenAI Responses bodies -> the chat the templates take (no server: the adapters'
request modules, table by table). The SDK round trips are in test_anthropic_server.py and
test_responses_server.py."""
from __future__ import annotations

import json

import pytest

from specserve.server.apis.anthropic.protocol import MessagesRequest
from specserve.server.apis.anthropic.request import chat_messages, system_text
from specserve.server.apis.openai.protocol import ResponsesRequest
from specserve.server.apis.openai.request import function_tools
from specserve.server.apis.openai.request import chat_messages as responses_chat
from specserve.server.apis.shared.validation import parse
from specserve.server.http.errors import ApiError


def _anthropic(**body) -> list[dict]:
    return chat_messages(parse(MessagesRequest, {"model": "x", "max_tokens": 8, **body}))


def _refusal(fn, **body) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(**body)
    assert e.value.status == 400
    return e.value


def test_anthropic_blocks_become_the_templates_chat():
    msgs = _anthropic(system=[{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": "B"}], messages=[
        {"role": "user", "content": "Fix it"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look first", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py", "n": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x = 1"}]},
            {"type": "text", "text": "Now "}, {"type": "text", "text": "fix."},
            {"type": "tool_result", "tool_use_id": "t2", "content": "late", "is_error": True}]}])
    assert msgs == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "Fix it"},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "look first", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py", "n": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "x = 1"},  # blocks keep their order
        {"role": "user", "content": "Now fix."},
        {"role": "tool", "tool_call_id": "t2", "content": "late"}]


def test_claude_codes_per_request_stamp_is_fixed_so_the_prefix_stays_cached():
    a = system_text("x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli; cch=a5145;You are Claude Code")
    b = system_text("x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli; cch=0f3e9;You are Claude Code")
    assert a == b and "cch=fffff;" in a and a.endswith("You are Claude Code")
    assert system_text("cch=a5145; is text elsewhere") == "cch=a5145; is text elsewhere"


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                  "content": [{"type": "image"}]}]}]},
     "messages[0].content[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]}, "system[0].type"),
])
def test_anthropic_messages_that_cannot_be_rendered_are_refused_by_field(body, param):
    assert _refusal(_anthropic, **body).param == param


@pytest.mark.parametrize("body, param", [
    ({"stop_sequences": ["x"] * 17}, "stop_sequences"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"tool_choice": {"type": "all"}}, "tool_choice.type"),
    ({"tools": [{"name": "bad name", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
])
def test_anthropic_fields_are_checked_by_field(body, param):
    e = _refusal(parse, model=MessagesRequest, value={"model": "x", "max_tokens": 8, "messages": [], **body})
    assert e.param == param


def test_stop_sequences_join_the_stop_strings():
    fields = parse(MessagesRequest, {"max_tokens": 8, "messages": [], "stop_sequences": ["END", "", "\n\n"],
                                     "stop": ["END"]})
    assert fields.stop == ("END", "\n\n")
    assert parse(MessagesRequest, {"thinking": {"type": "enabled", "budget_tokens": 64}}).reasoning_budget() == 64


def _responses(**body) -> list[dict]:
    return responses_chat(parse(ResponsesRequest, {"model": "x", **body}))


def test_responses_items_become_the_templates_chat():
    msgs = _responses(instructions="Be brief.", input=[
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                     {"type": "input_text", "text": "now?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        {"role": "assistant", "content": "Rain at noon."}])
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather now?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "call it", "tool_calls": [  # one turn
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "assistant", "content": "Rain at noon."}]
    assert _responses(input="Hi") == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a": '}]}, "input[0].arguments"),
])
def test_responses_input_that_cannot_be_rendered_is_refused_by_field(body, param):
    assert _refusal(_responses, **body).param == param


def test_hosted_tools_are_left_out_and_function_tools_checked():
    fields = parse(ResponsesRequest, {"input": "x", "tools": [
        {"type": "web_search"}, {"type": "function", "name": "f", "parameters": {"type": "object"}}]})
    assert [(i, t.name) for i, t in function_tools(fields)] == [(1, "f")]
    bad = parse(ResponsesRequest, {"input": "x", "tools": [{"type": "function", "name": "f", "extra": 1}]})
    assert _refusal(function_tools, fields=bad).param == "tools[0].extra"


def test_text_format_is_a_grammar_and_reasoning_effort_is_read():
    fields = parse(ResponsesRequest, {"input": "x", "reasoning": {"effort": "high"}, "text": {"format": {
        "type": "json_schema", "name": "n", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})
    param, grammar = fields.format_grammar()
    assert param == "text.format" and json.dumps(grammar) and fields.reasoning_effort() == "high"
    assert parse(ResponsesRequest, {"text": {"format": {"type": "text"}}}).format_grammar() is None
    assert parse(ResponsesRequest, {"text": {"format": {"type": "json_object"}}}).format_grammar()[0] == "text.format"
