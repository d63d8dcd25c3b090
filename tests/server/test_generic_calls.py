"""Tools on templates whose call form specserve does not read (server/core/constraints/generic.py,
genericcalls.py) and on Llama 3.x's bare JSON form: which template gets which form, each form's grammar
against llguidance with a real vocabulary, answers read back whole and streamed, and the chat rewritten
for a template that renders no tools."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

llguidance = pytest.importorskip("llguidance")

from specserve.backends.llama_cpp import LlamaCppModel  # noqa: E402
from specserve.grammar import from_lark  # noqa: E402
from specserve.server.core.constraints.generic import generic_chat, generic_lark  # noqa: E402
from specserve.server.core.constraints.genericcalls import GenericReader  # noqa: E402
from specserve.server.core.constraints.toolcalls import answer, finish  # noqa: E402
from specserve.server.core.constraints.tools import GENERIC_FORM, JSON_FORM, call_form, template_input, tools_lark  # noqa: E402,E501

sys.path.insert(0, str(Path(__file__).parent.parent))
import tiny_models  # noqa: E402

# Llama 3.x's tool template cut to what decides its form: tools in the first user message, a past call
# written `{"name": ..., "parameters": ...}`, a result in an ipython turn
LLAMA3_TEMPLATE = r'''{{- bos_token }}{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{{- '{"name": "' + message.tool_calls[0].function.name + '", ' }}{{- '"parameters": ' }}
{{- message.tool_calls[0].function.arguments | tojson }}{{- "}" }}<|eot_id|>
{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
{%- if loop.first and tools is not none %}{%- for t in tools %}{{- t | tojson(indent=4) }}{%- endfor %}{%- endif %}
{{- message.content + '<|eot_id|>' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}'''

LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
           "additionalProperties": False, "x-guidance": LAYOUT}
TIME = {"type": "object", "properties": {}, "additionalProperties": False, "x-guidance": LAYOUT}
NAMES, SCHEMAS = ("get_weather", "get_time"), [WEATHER, TIME]
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in zip(NAMES, SCHEMAS)]


def _model(tmp_path_factory, template: str, added=()) -> LlamaCppModel:
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("gc") / "m.gguf", seed=1, chat_template=template,
                                        added_tokens=added)
    return LlamaCppModel(str(path))


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return _model(tmp_path_factory, tiny_models.CHATML_TEMPLATE)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return _model(tmp_path_factory, LLAMA3_TEMPLATE)


def test_each_template_gets_the_form_it_spells(chatml, llama3, tmp_path_factory):
    qwen = _model(tmp_path_factory, tiny_models.QWEN_TOOLS_TEMPLATE, tiny_models.TOOL_TAGS)
    assert (call_form(chatml).kind, call_form(llama3).kind, call_form(qwen).kind) == ("generic", "json", "tags")
    assert "generic" in call_form(chatml).describe() and "Llama 3" in call_form(llama3).describe()


def _complete(model, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(model.grammar_tokenizer(), grammar)
    assert not m.is_error(), m.get_error()
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    return m.validate_tokens(tokens) == len(tokens) and m.consume_tokens(tokens) and m.is_accepting()


PARIS, TIME_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"name": "get_time", "arguments": {}}'
GENERIC = {"reply": '{"response": "It is \\"sunny\\".\\nBye."}', "call": f'{{"tool_call": {PARIS}}}',
           "time": f'{{"tool_call": {TIME_CALL}}}', "list": f'{{"tool_calls": [{PARIS}, {TIME_CALL}]}}',
           "list-of-one": f'{{"tool_calls": [{TIME_CALL}]}}', "bad-args": f'{{"tool_call": {PARIS}}}'.replace(
               "Paris", "Lyon"), "text": "It is sunny.", "loose": f'{{"tool_call":{PARIS}}}',
           "unknown-fn": '{"tool_call": {"name": "get_date", "arguments": {}}}', "reply-not-string": '{"response": 3}'}
ALLOWED = {("auto", False): {"reply", "call", "time"}, ("auto", True): {"reply", "list", "list-of-one"},
           ("required", False): {"call", "time"}, ("required", True): {"list", "list-of-one"},
           ("get_time", True): {"time"}}


@pytest.mark.parametrize("choice,parallel", list(ALLOWED), ids=[f"{c}-{p}" for c, p in ALLOWED])
def test_the_generic_grammar_lets_through_what_each_choice_allows(chatml, choice, parallel):
    grammar = from_lark(generic_lark(NAMES, SCHEMAS, choice, parallel))
    assert {name for name, text in GENERIC.items() if _complete(chatml, grammar, text)} == ALLOWED[choice, parallel]


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA = {"call": LLAMA_CALL, "text": "It is sunny.", "two": LLAMA_CALL + "\n" + LLAMA_CALL.replace("Paris", "Rome"),
         "tagged": f"<tool_call>\n{PARIS}\n</tool_call>", "bad-args": LLAMA_CALL.replace("Paris", "Lyon"),
         "text-then-call": "Let me look.\n" + LLAMA_CALL}


@pytest.mark.parametrize("choice,allowed", [("auto", {"call", "text", "text-then-call"}),
                                            ("required", {"call"}), ("get_weather", {"call"}),
                                            ("none", {"text", "tagged", "call", "two", "bad-args", "text-then-call"})])
def test_llama3_calls_are_its_bare_json_with_parameters(llama3, choice, allowed):
    """One call a turn, as its template renders them; under "auto" text may come first (nothing after the
    call: a tagged one's closing tag is refused, its JSON line being read as the call)."""
    grammar = from_lark(tools_lark(JSON_FORM, NAMES, SCHEMAS, choice, False))
    assert {name for name, text in LLAMA.items() if _complete(llama3, grammar, text)} == allowed


def _read(text: str, size: int, parallel: bool = True) -> tuple[dict, str, str | None, str]:
    """Fed `size` characters at a time: the message, finish reason, cut, and the streamed text."""
    reader, streamed = GenericReader(GENERIC_FORM, NAMES, parallel), ""
    for i in range(0, len(text), size):
        streamed += "".join(e.text for e in reader.feed(text[i:i + size]) if type(e).__name__ == "Text")
    streamed += "".join(e.text for e in reader.close() if type(e).__name__ == "Text")
    return reader.message(), finish(reader, "stop"), reader.cut(), streamed


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_generic_answer_reads_back_the_same_however_it_streams(size):
    emoji = '{"response": "caf\\u00e9 \\ud83d\\ude00 \\\\ \\"q\\""}'
    message, reason, cut, streamed = _read(emoji, size)
    assert message == {"role": "assistant", "content": 'café 😀 \\ "q"'} and streamed == message["content"]
    assert (reason, cut) == ("stop", None)
    message, reason, cut, streamed = _read(GENERIC["list"], size)
    assert _calls(message) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert (message["content"], reason, cut, streamed) == (None, "tool_calls", None, "")
    assert _read(GENERIC["call"], size, parallel=False)[0]["tool_calls"][0]["function"]["arguments"] == \
        '{"city": "Paris"}'  # in json.dumps's layout, as the template renders a past call
    assert _read("no JSON here", size)[0]["content"] == "no JSON here"  # not the form: text as it is


def test_a_cut_generic_call_is_left_out_and_said_and_a_repeat_ends_the_calls():
    message, reason, cut, _ = _read(GENERIC["list"][:-12], 3)
    assert _calls(message) == [("get_weather", {"city": "Paris"})] and "get_time" in cut and reason == "stop"
    assert "left out" in _read('{"tool_ca', 1)[2] and _read('{"resp', 1)[:3] == (
        {"role": "assistant", "content": None}, "stop", None)
    again = f'{{"tool_calls": [{PARIS}, {PARIS}, {TIME_CALL}]}}'
    reader = GenericReader(GENERIC_FORM, NAMES, True)
    reader.feed(again)
    assert reader.ended and _calls(reader.message()) == [("get_weather", {"city": "Paris"})]


def test_llama3_s_call_is_read_back_as_a_call():
    message, reason, cut = answer(JSON_FORM, LLAMA_CALL, "stop", NAMES, False)
    assert _calls(message) == [("get_weather", {"city": "Paris"})] and (reason, cut) == ("tool_calls", None)
    message, reason, _ = answer(JSON_FORM, "Sunny in Paris.", "stop", NAMES, False)
    assert message == {"role": "assistant", "content": "Sunny in Paris."} and reason == "stop"


HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


def test_the_chat_is_rewritten_for_a_template_that_renders_no_tools():
    out = generic_chat(HISTORY, TOOLS, "auto", False, tiny_models.CHATML_TEMPLATE)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call any of the following tools")
    system = out[0]["content"]
    assert '"get_time"' in system and "`tool_call`" in system and "`response`" in system
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert json.loads(out[3]["content"]) == {"tool_response": {"tool": "get_weather", "content": "sunny"}}
    assert "`tool_calls`" in generic_chat(HISTORY, TOOLS, "required", True, "")[0]["content"]
    # nothing to call: the tools are not described
    assert generic_chat(HISTORY, TOOLS, "none", False, "")[0]["content"] == "Be brief."
    gemma2 = "{{ raise_exception('System role not supported') }}"
    first = generic_chat(HISTORY[1:2], TOOLS, "get_time", False, gemma2)
    assert len(first) == 1 and first[0]["role"] == "user" and "calling get_time" in first[0]["content"]


def test_only_the_generic_form_rewrites_the_chat(chatml, llama3):
    assert template_input(llama3, HISTORY, TOOLS) == (HISTORY, TOOLS)  # its template renders them itself
    messages, tools = template_input(chatml, HISTORY, TOOLS)
    assert tools is None and messages[3]["role"] == "user" and "tool_response" in messages[3]["content"]
    plain = [{"role": "user", "content": "hi"}]
    assert template_input(chatml, plain, None) == (plain, None)
