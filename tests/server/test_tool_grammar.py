"""The tools grammar (server/core/constraints/tools.py) against llguidance with a real vocabulary: per tool_choice,
which answers it lets through. The tiny model carries Qwen2.5's <tool_call> tokens; a second one
without them spells the tags as text."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

llguidance = pytest.importorskip("llguidance")

from specserve.backends.llama_cpp import LlamaCppModel  # noqa: E402
from specserve.grammar import from_lark  # noqa: E402
from specserve.server.core.constraints.tools import call_form, tools_lark  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent))
import tiny_models  # noqa: E402

LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
           "additionalProperties": False, "x-guidance": LAYOUT}
TIME = {"type": "object", "properties": {}, "x-guidance": LAYOUT}
NAMES, SCHEMAS = ("get_weather", "get_time"), [WEATHER, TIME]


def _tiny(tags: str, tmp_path_factory) -> LlamaCppModel:
    added = tiny_models.TOOL_TAGS if tags == "special" else ()
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("tg") / "m.gguf", seed=1, added_tokens=added,
                                        chat_template=tiny_models.QWEN_TOOLS_TEMPLATE)
    return LlamaCppModel(str(path))


@pytest.fixture(scope="module", params=["special", "plain"])
def model(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def special_model(tmp_path_factory):
    """The vocabulary whose tags are single tokens."""
    return _tiny("special", tmp_path_factory)


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


PARIS, TIME_CALL = call("get_weather", {"city": "Paris"}), call("get_time", {})
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Rome"\n  }\n}\n```'
ANSWERS = {"text": "It is sunny.", "call": PARIS, "two": PARIS + "\n" + TIME_CALL, "time": TIME_CALL,
           "bad-args": call("get_weather", {"city": "Lyon"}), "loose-layout": PARIS.replace('": "', '":"'),
           "unknown-fn": call("get_date", {}), "text-then-call": "Let me check.\n" + PARIS,
           # calls written as JSON in the text (textcalls.py), and text that only looks like one
           "fenced": "Sure:\n" + FENCED, "bare": '{"name": "get_time", "parameters": {}}',
           "fenced-bad-args": FENCED.replace("Rome", "Lyon"),
           "two-fenced": FENCED + "\n" + FENCED.replace("Rome", "Paris"),
           "mention": 'Call {"name": "get_weather", "arguments": {"city": "Lyon"}} to know.',
           "undeclared": '{"name": "get_date", "arguments": {"day": 1}}'}
WRITTEN = {"fenced", "bare", "fenced-bad-args", "two-fenced", "mention", "undeclared"}
# (tool_choice, parallel) -> the answers it lets through; the rest it refuses
ALLOWED = {
    ("auto", True): {"text", "call", "two", "time", "text-then-call", "fenced", "bare", "two-fenced", "mention",
                     "undeclared"},
    ("auto", False): {"text", "call", "time", "text-then-call", "fenced", "bare", "mention", "undeclared"},
    ("none", True): {"text"} | WRITTEN,  # JSON in the text is text where no call is allowed
    ("required", True): {"call", "two", "time"},
    ("required", False): {"call", "time"},
    ("get_time", True): {"time"},
}


def _complete(model, grammar: str, text: str) -> bool:
    """Whether the text, tokenized as the model would write it, is a whole answer of the grammar."""
    m = llguidance.LLMatcher(model.grammar_tokenizer(), grammar)
    assert not m.is_error(), m.get_error()
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    return m.validate_tokens(tokens) == len(tokens) and m.consume_tokens(tokens) and m.is_accepting()


@pytest.mark.parametrize("choice,parallel", list(ALLOWED), ids=[f"{c}-{p}" for c, p in ALLOWED])
def test_each_choice_lets_through_what_it_should(model, choice, parallel):
    form = call_form(model)
    grammar = from_lark(tools_lark(form, NAMES, SCHEMAS, choice, parallel))
    allowed = set(ALLOWED[choice, parallel])
    if not form.special:  # tags spelled as text: a call only at the start; text may then spell a tag. Under
        # "auto" the JSON on the line after it is a call written in the text: the closing tag after it is
        # text that may follow only where more than one call may
        later = choice == "none" or choice == "auto" and parallel
        allowed = {a for a in allowed if a != "text-then-call"} | ({"text-then-call"} if later else set())
    got = {name for name, text in ANSWERS.items() if _complete(model, grammar, text)}
    assert got == allowed


def test_the_tags_are_special_only_where_they_are_single_tokens(model):
    form = call_form(model)
    ids = model.tokenize("<tool_call>", add_special=False, parse_special=True)
    assert form.special == (len(ids) == 1)


def test_text_cannot_spell_the_open_tag_in_plain_tokens(special_model):
    """Where the tags are special tokens, text spelling `<tool_call>` in plain tokens would read back
    as a call (the reader reads text): the grammar refuses it in text; inside arguments it is a
    JSON string's text, and both tags may be spelled there."""
    model = special_model
    form = call_form(model)
    assert form.special
    free = dict(WEATHER, properties={"city": {"type": "string"}})
    grammar = from_lark(tools_lark(form, NAMES, [free, TIME], "auto", True))

    def plain(text: str) -> list[int]:  # the tags' text in plain tokens: cut before each '>' so none is found
        pieces = text.replace("_call>", "_call\x00>").split("\x00")
        return [t for p in pieces for t in model.tokenize(p, add_special=False, parse_special=False)]

    def accepts(tokens: list[int]) -> bool:
        m = llguidance.LLMatcher(model.grammar_tokenizer(), grammar)
        return m.validate_tokens(tokens) == len(tokens) and m.consume_tokens(tokens) and m.is_accepting()

    special = lambda text: model.tokenize(text, add_special=False, parse_special=True)  # noqa: E731
    assert plain("<tool_call>") != special("<tool_call>")
    assert accepts(plain("Say it with tags."))
    assert not accepts(plain("Say <tool_call> here."))
    args = json.dumps({"city": "</tool_call><tool_call>"})
    call_tokens = special("<tool_call>") + plain('\n{"name": "get_weather", "arguments": ' + args + "}\n") \
        + special("</tool_call>")
    assert accepts(call_tokens)
