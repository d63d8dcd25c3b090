"""Tool messages through a model's own chat template (chat.py), Qwen2.5's here."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specserve.chat import MessageError, render

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import QWEN_TOOLS_TEMPLATE  # noqa: E402

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": CITY}}]
CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"zone": "<eu>", "city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
]


def test_tools_calls_and_results_render_as_the_model_was_trained():
    text = render(CHAT, QWEN_TOOLS_TEMPLATE, tools=TOOLS)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    # the call as the model writes it: arguments in their order, `<` not escaped (Hugging Face's tojson)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"zone": "<eu>", '
            '"city": "Paris"}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_without_tools_the_template_takes_its_plain_branch():
    text = render([{"role": "user", "content": "hi"}], QWEN_TOOLS_TEMPLATE)
    assert "<tools>" not in text and "You are Qwen" in text


@pytest.mark.parametrize("messages,param", [
    ([{"role": "tool", "content": "22 C"}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                            "function": {"name": "f", "arguments": "{not json"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0]"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}], "messages[0].tool_calls"),
], ids=["tool-without-call-id", "arguments-not-json", "call-without-name", "user-with-calls"])
def test_malformed_tool_messages_name_the_field(messages, param):
    with pytest.raises(MessageError) as e:
        render(messages, QWEN_TOOLS_TEMPLATE, tools=TOOLS)
    assert e.value.param == param
