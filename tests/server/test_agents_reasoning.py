"""A reasoning model through the agents' APIs with the official SDKs: its `<think>` block as Anthropic's
`thinking` block and a Responses `reasoning` item, whole and streamed; Anthropic's `thinking` budget and
Responses' `reasoning.effort` "none"; the same reasoning and text as chat's, speculation on.
The tiny model's template opens the block itself (server_fixtures.tiny_reasoning_pair)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, serve_args, tiny_reasoning_pair  # noqa: E402

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

ASK = [{"role": "user", "content": "Is the cat on the mat?"}]
SPEC = {"temperature": 0, "speculative": {"mode": "draft", "draft_max": 4}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("agents_reasoning")
    tiny_reasoning_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _message(claude, budget: int = 6, **kw):
    return claude.messages.create(model="x", max_tokens=40, messages=ASK, extra_body=SPEC,
                                  thinking={"type": "enabled", "budget_tokens": budget}, **kw)


def _blocks(message) -> list[tuple]:
    return [(b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in message.content]


def test_the_block_is_a_thinking_block_first_and_the_same_as_chats_reasoning_content(claude, oai):
    m = _message(claude)
    assert [b.type for b in m.content] == ["thinking", "text"] and m.content[0].signature == ""
    chat = oai.chat.completions.create(model="x", max_tokens=40, messages=ASK, temperature=0,
                                       extra_body={"reasoning_budget": 6}).choices[0].message
    assert (m.content[0].thinking, m.content[1].text) == (chat.model_extra["reasoning_content"], chat.content)
    plain = claude.messages.create(model="x", max_tokens=40, messages=ASK, extra_body={"temperature": 0,
                                   "speculative": {"mode": "none"}}, thinking={"type": "enabled", "budget_tokens": 6})
    assert plain.content == m.content  # speculation changes nothing, inside the block or after it


def test_streamed_the_thinking_block_is_index_0_and_signed_before_it_stops(claude):
    with claude.messages.stream(model="x", max_tokens=40, messages=ASK, extra_body=SPEC,
                                thinking={"type": "enabled", "budget_tokens": 6}) as s:
        events = list(s)
        final = s.get_final_message()
    raw = [e for e in events if e.type in ("content_block_start", "content_block_delta", "content_block_stop")]
    assert raw[0].type == "content_block_start" and raw[0].index == 0 and raw[0].content_block.type == "thinking"
    stop0 = next(i for i, e in enumerate(raw) if e.type == "content_block_stop" and e.index == 0)
    assert raw[stop0 - 1].delta.type == "signature_delta"
    assert any(e.type == "content_block_start" and e.index == 1 and e.content_block.type == "text" for e in raw)
    assert _blocks(final) == _blocks(_message(claude))


def test_thinking_budget_and_disabled(claude):
    short, longer = _message(claude, 4).content[0].thinking, _message(claude, 12).content[0].thinking
    assert longer.startswith(short) and len(longer) > len(short)
    off = claude.messages.create(model="x", max_tokens=20, messages=ASK, extra_body=SPEC,
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


def test_the_block_is_a_reasoning_item_first_whole_and_streamed(oai, claude):
    r = oai.responses.create(model="x", input=ASK, max_output_tokens=40, temperature=0,
                             extra_body={"speculative": SPEC["speculative"]})
    assert [o.type for o in r.output][:1] == ["reasoning"] and r.output[0].content[0].type == "reasoning_text"
    events = list(oai.responses.create(model="x", input=ASK, max_output_tokens=40, temperature=0, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == r.output[0].content[0].text and events[2].item.type == "reasoning"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    none = oai.responses.create(model="x", input=ASK, max_output_tokens=20, temperature=0, reasoning={"effort": "none"})
    assert [o.type for o in none.output] == ["message"]
