"""The built-in templates `--chat-template NAME` selects: llama-server's render what its own (C++) templates
render (the expected prompts below are llama-server b11434's `/apply-template` answers for this chat with
`--no-jinja --chat-template NAME`); `hermes` brings Qwen2.5's tool calls to a ChatML model."""
from __future__ import annotations

import json

import pytest

from specserve.chat import render
from specserve.chat_templates import BUILTIN, HERMES, builtin

CHAT = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
LLAMA_SERVER = {  # recorded from llama-server b11434
    "chatml": "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
              "Hello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello"
                 "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\n Be brief. <|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello<|end|>\n"
            "<|user|>\nBye<|end|>\n<|assistant|>\n",
    "zephyr": "<|system|>\n Be brief. <|endoftext|>\n<|user|>\nHi there<|endoftext|>\n"
              "<|assistant|>\nHello<|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(LLAMA_SERVER))
def test_a_llama_server_name_renders_what_llama_server_renders(name):
    assert render(CHAT, builtin(name)) == LLAMA_SERVER[name]
    assert render(CHAT, builtin(name), add_generation_prompt=False) != LLAMA_SERVER[name]


def test_names_are_the_builtins_and_anything_else_is_not_one():
    assert builtin(" ChatML ") == BUILTIN["chatml"] and builtin("{{ messages }}") is None
    assert set(BUILTIN) == set(LLAMA_SERVER) | {"hermes"}


def test_hermes_renders_tools_calls_and_results_as_qwen_does():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = render(chat, HERMES, tools=[tool])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and json.dumps(tool) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert render(CHAT, HERMES) == LLAMA_SERVER["chatml"]  # without tools: ChatML


def test_templates_get_today_and_loop_controls_as_llama_server_and_hugging_face_give_them():
    """llama-server passes date_string and datetime; Hugging Face's renderer has strftime_now and
    {% break %} (Command R7B's template)."""
    import datetime

    today = datetime.date.today()
    text = render([{"role": "user", "content": "hi"}],
                  "{{ date_string }}|{{ datetime }}|{{ strftime_now('%Y') }}|"
                  "{% for m in messages %}{{ m.content }}{% break %}{% endfor %}")
    assert text == f"{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}|{today.year}|hi"


def test_template_kwargs_reach_the_template_and_enable_thinking_is_on_unless_turned_off():
    source = "{{ enable_thinking }}|{{ custom }}|{{ messages | length }}"
    chat = [{"role": "user", "content": "hi"}]
    assert render(chat, source) == "True||1"  # llama-server's default (its --reasoning auto)
    assert render(chat, source, template_kwargs={"enable_thinking": False, "custom": "x"}) == "False|x|1"
    assert render(chat, source, template_kwargs={"messages": []}) == "True||1"  # the renderer's own stay its own


def test_firefunction_v2_gets_its_tools_as_functions_as_llama_server_gives_them():
    """Its template reads `functions` (the tools as indented JSON, "" without tools) and fails without it."""
    template = ('{%- set suffix = "Available functions as JSON spec:\\n" + functions -%}{{ suffix }}|'
                '{%- for m in messages %}{{ m.content }}{% endfor %}{# call: functools[...] #}')
    assert render([{"role": "user", "content": "hi"}], template).endswith("spec:\n|hi")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    text = render([{"role": "user", "content": "hi"}], template, tools=[tool])
    assert json.loads(text[len("Available functions as JSON spec:\n"):text.index("|")]) == [tool]
    assert '\n  {\n    "type": "function"' in text


def test_an_assistant_messages_reasoning_content_reaches_the_template():
    """Agents send earlier turns' reasoning back (Anthropic's thinking blocks, OpenAI's reasoning_content);
    reasoning templates render it where they keep it (Qwen3's: the turns after the last query)."""
    template = "{% for m in messages %}{{ m.role }}:{{ m.reasoning_content or '-' }}:{{ m.content }};{% endfor %}"
    msgs = [{"role": "user", "content": "q", "reasoning_content": "not a user's"},
            {"role": "assistant", "content": "a", "reasoning_content": "because"}]
    assert render(msgs, template) == "user:-:q;assistant:because:a;"
