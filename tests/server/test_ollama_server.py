"""Ollama's API through the real server with the official `ollama` Python client, unmodified.

The tiny model carries Qwen2.5's chat template and <tool_call> tokens (server_fixtures.tiny_tools_pair).
Its text is noise, but deterministic under greedy decoding: what these tests compare is the same text
reached by different ways (the client's stream and its whole answer, /api/chat and /v1/chat/completions),
and the shapes Ollama's clients read: the NDJSON lines, the durations, the model listings, the errors.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_reasoning_pair, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

ollama = pytest.importorskip("ollama")

HI = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "num_predict": 12}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ollama")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log", api_key=API_KEY)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, headers=server.headers, timeout=60)


def test_list_show_ps_and_version(server, client):
    models = client.list().models
    assert [m.model for m in models] == ["tiny"]
    d = models[0].details
    assert (d.format, d.family, d.quantization_level) == ("gguf", "llama", "F32") and d.parameter_size
    assert models[0].size > 0 and len(models[0].digest) == 64
    shown = client.show("tiny:latest")  # Ollama's default tag names the same model
    assert "tools" in shown.capabilities and "completion" in shown.capabilities
    assert "<tool_call>" in shown.template and shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 1024 and shown.modelinfo["tokenizer.ggml.tokens"] is None
    assert "num_ctx 2048" in shown.parameters  # the server's context, which clients send back as num_ctx
    running = client.ps().models
    assert running[0].model == "tiny" and running[0].context_length == 2048
    version = httpx.get(server.url + "/api/version", headers=server.headers).json()
    assert version["version"].count(".") == 2 and "specserve" in version


def test_chat_whole_and_streamed_are_the_same_answer(server, client):
    whole = client.chat(model="tiny", messages=HI, options=GREEDY)
    assert whole.done and whole.done_reason == "length" and whole.message.role == "assistant"
    assert whole.eval_count == 12 and whole.prompt_eval_count > 10
    assert whole.total_duration >= whole.eval_duration > 0 and whole.load_duration == 0
    parts = list(client.chat(model="tiny", messages=HI, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == 12
    # the same text as OpenAI's chat completions give it: one request, whichever API
    openai = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=60, json={
        "model": "tiny", "messages": HI, "temperature": 0, "max_tokens": 12}).json()
    assert openai["choices"][0]["message"]["content"] == whole.message.content


def test_the_stream_is_ndjson_with_speculation_in_the_last_line(server):
    body = {"model": "tiny", "messages": HI, "options": GREEDY, "speculative": {"mode": "draft", "draft_max": 4}}
    with httpx.stream("POST", server.url + "/api/chat", json=body, headers=server.headers, timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and {"created_at", "model", "message"} <= set(lines[0])
    spec = lines[-1]["speculative"]
    assert spec["mode"] == "draft" and spec["drafted"] >= spec["accepted"] >= 0


def test_generate_and_format_schema(client):
    g = client.generate(model="tiny", prompt="Say hi", options=GREEDY)
    assert g.done and g.eval_count == 12 and isinstance(g.response, str)
    raw = client.generate(model="tiny", prompt="Say hi", raw=True, options=GREEDY)
    assert raw.prompt_eval_count < g.prompt_eval_count  # no template around it
    j = client.generate(model="tiny", prompt="Say hi", format=SCHEMA, options={"temperature": 0, "num_predict": 40})
    assert j.done_reason == "stop" and isinstance(json.loads(j.response)["a"], int)
    c = client.chat(model="tiny", messages=HI, format="json", options=GREEDY)
    assert c.message.content.startswith("{")  # a JSON object (the tiny model's keys are long noise)


def test_a_load_request_answers_at_once(client):
    """Ollama's clients load a model with an empty prompt: here it is loaded already."""
    assert client.generate(model="tiny").done_reason == "load"


@pytest.mark.parametrize("call,status,words", [
    (lambda c: c.chat(model="llama3.2", messages=HI), 404, "not found"),
    (lambda c: c.generate(model="tiny", prompt="hi", images=["aGk="]), 400, "reads text"),
    (lambda c: c.chat(model="tiny", messages=[{**HI[0], "images": ["aGk="]}]), 400, "reads text"),
    (lambda c: c.chat(model="tiny", messages=HI, options={"num_ctx": 1 << 20}), 400, "num_ctx"),
    (lambda c: c.pull("llama3.2"), 501, "local GGUF"),
    (lambda c: c.delete("tiny"), 501, "local GGUF"),
    (lambda c: c.embed(model="llama3.2", input="hi"), 404, "not found"),
])
def test_errors_are_ollamas(client, call, status, words):
    with pytest.raises(ollama.ResponseError) as e:
        call(client)
    assert e.value.status_code == status and words in e.value.error


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A reasoning model (Qwen3-Thinking's template opens the block itself), no key."""
    d = tmp_path_factory.mktemp("ollama_thinking")
    tiny_reasoning_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048"), d / "serve.log")
    yield ollama.Client(host=srv.url, timeout=60)
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


def test_think_parts_the_reasoning_or_closes_it(thinker):
    assert "thinking" in thinker.show("tiny").capabilities
    thought = thinker.chat(model="tiny", messages=HI, think=True, options=GREEDY).message
    assert thought.thinking and thought.content == ""  # the random model never closes the block itself
    parts = list(thinker.chat(model="tiny", messages=HI, think=True, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == thought.thinking
    plain = thinker.chat(model="tiny", messages=HI, think=False, options=GREEDY).message
    assert not plain.thinking and plain.content  # the block closed at once: the answer follows it
    g = thinker.generate(model="tiny", prompt="Say hi", think=True, options=GREEDY)
    assert g.thinking and g.response == ""
