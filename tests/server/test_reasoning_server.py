"""A reasoning model through the real server: its `<think>` block parted into `reasoning_content` (whole and
streamed), `reasoning_format`, the budget closing the block, tools after it, speculation on throughout.
The tiny model carries a Qwen3-Thinking-style template that opens the block itself
(server_fixtures.tiny_reasoning_pair), so every answer starts inside it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, chat, serve_args, tiny_reasoning_pair  # noqa: E402

pytestmark = pytest.mark.server

ASK = [{"role": "user", "content": "Is the cat on the mat?"}]
GREEDY = {"temperature": 0, "max_tokens": 40}
BODY = {"messages": ASK, **GREEDY}
C = "/v1/chat/completions"
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("reasoning")
    tiny_reasoning_pair(d)
    return d


@pytest.fixture(scope="module")
def server(models):
    srv = ServerProcess(serve_args(models, "-c", "2048", "--parallel", "2"), models / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


def _streamed(http, **fields) -> tuple[str, str, list[dict], str]:
    """reasoning_content, content, tool calls and finish_reason put together from the deltas."""
    reasoning, content, calls, finish = "", "", [], None
    with http.stream("POST", C, json={"messages": ASK, **GREEDY, **fields, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                d = choice["delta"]
                reasoning += d.get("reasoning_content") or ""
                content += d.get("content") or ""
                calls += d.get("tool_calls") or []
                finish = choice["finish_reason"] or finish
    return reasoning, content, calls, finish


@pytest.mark.parametrize("budget", [4, 12])
def test_a_budget_closes_the_block_and_the_answer_follows_it(http, budget):
    message = chat(http, BODY, reasoning_budget=budget)["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]  # the random model never closes it itself
    longer = chat(http, BODY, reasoning_budget=budget + 8)["choices"][0]["message"]["reasoning_content"]
    assert longer.startswith(message["reasoning_content"]) and len(longer) > len(message["reasoning_content"])


def test_without_a_budget_an_unclosed_block_is_all_reasoning(http):
    choice = chat(http, BODY)["choices"][0]
    assert choice["message"]["reasoning_content"] and choice["message"]["content"] == ""
    assert choice["finish_reason"] == "length"


def test_streamed_deltas_add_up_to_the_whole_answer(http):
    whole = chat(http, BODY, reasoning_budget=6)["choices"][0]
    reasoning, content, _, finish = _streamed(http, reasoning_budget=6)
    assert (reasoning, content, finish) == (whole["message"]["reasoning_content"], whole["message"]["content"],
                                            whole["finish_reason"])


def test_continues_thinking_budget_tokens_is_the_same_budget(http):
    assert chat(http, BODY, thinking_budget_tokens=6)["choices"][0]["message"] == \
        chat(http, BODY, reasoning_budget=6)["choices"][0]["message"]


def test_reasoning_format_none_returns_the_raw_text(http):
    parted = chat(http, BODY, reasoning_budget=6)["choices"][0]["message"]
    raw = chat(http, BODY, reasoning_budget=6, reasoning_format="none")["choices"][0]["message"]
    assert "reasoning_content" not in raw
    before, after = raw["content"].split("</think>")
    assert before.strip() == parted["reasoning_content"] and after.lstrip() == parted["content"]


def test_speculation_gives_the_target_alones_text_inside_and_after_the_block(http):
    answers = []
    for mode in ("none", "draft", "ngram"):
        out = chat(http, BODY, reasoning_budget=10, max_tokens=50, speculative={"mode": mode, "draft_max": 4})
        answers.append(out["choices"][0]["message"])
        if mode == "draft":
            assert out["usage"]["speculative"]["accepted"] > 0
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_follows_the_block(http, stream):
    """The tools grammar starts after the block: reasoning first, then a valid call."""
    # the tiny vocabulary spells a call in ~70 tokens
    fields = dict(tools=TOOLS, tool_choice="required", reasoning_budget=5, max_tokens=120)
    if stream:
        reasoning, content, calls, finish = _streamed(http, **fields)
        arguments = "".join(c["function"].get("arguments") or "" for c in calls)
        name = calls[0]["function"]["name"]
    else:
        choice = chat(http, BODY, **fields)["choices"][0]
        reasoning, finish = choice["message"]["reasoning_content"], choice["finish_reason"]
        (call,) = choice["message"]["tool_calls"]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
    assert reasoning and finish == "tool_calls" and name == "get_weather"
    assert json.loads(arguments)["city"] in ("Paris", "Rome", "Oslo")


@pytest.mark.parametrize("fields,param,code", [
    ({"reasoning_format": "deepseek-legacy"}, "reasoning_format", "invalid_value"),
    ({"reasoning_budget": -2}, "reasoning_budget", "invalid_value"),
    ({"reasoning_budget": "8"}, "reasoning_budget", None),
    ({"reasoning_budget": 8, "thinking_budget_tokens": 9}, "thinking_budget_tokens", "conflicting_parameters"),
], ids=["format-unknown", "budget-below-minus-one", "budget-not-a-number", "two-budgets-differ"])
def test_bad_reasoning_fields_are_400_naming_the_field(http, fields, param, code):
    r = http.post(C, json={"messages": ASK, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and (code is None or err["code"] == code), err


def test_the_servers_flags_set_the_defaults(models):
    """--reasoning-format none: raw text unless a request asks; --reasoning-budget: every chat's budget."""
    srv = ServerProcess(serve_args(models, "-c", "1024", "--parallel", "1", "--reasoning-format", "none",
                                   "--reasoning-budget", "5"), models / "flags.log")
    try:
        with srv.client() as http:
            raw = chat(http, BODY)["choices"][0]["message"]
            parted = chat(http, BODY, reasoning_format="auto")["choices"][0]["message"]
            unlimited = chat(http, BODY, reasoning_format="deepseek", reasoning_budget=-1)["choices"][0]["message"]
    finally:
        assert srv.stop() == 0
    assert "reasoning_content" not in raw and "</think>" in raw["content"]
    assert parted["reasoning_content"] and parted["content"]
    assert unlimited["content"] == ""  # -1 given: unlimited, whatever the server's default
