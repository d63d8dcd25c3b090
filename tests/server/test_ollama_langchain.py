"""LangChain's Ollama integration (`langchain-ollama`), unmodified, against specserve's Ollama API.

ChatOllama and OllamaLLM send every option they know (mirostat, tfs_z, num_gpu, ... most as null), ask for
the model's details on start when told to validate, and read the NDJSON stream field by field: what a user of
LangChain meets first. The tiny model's text is noise but greedy-deterministic: the tests compare ways to the
same answer, and the shapes LangChain reads.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

langchain_ollama = pytest.importorskip("langchain_ollama")

HI = [("user", "What is the weather in Paris?")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("langchain")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log", api_key=API_KEY)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


def chat_model(server, **kw):
    return langchain_ollama.ChatOllama(
        model="tiny", base_url=server.url, client_kwargs={"headers": server.headers, "timeout": 60},
        temperature=0, num_predict=12, **kw)


def test_invoke_and_stream_give_the_same_answer(server):
    llm = chat_model(server, validate_model_on_init=True)
    whole = llm.invoke(HI)
    assert whole.content and whole.response_metadata["done_reason"] == "length"
    assert whole.usage_metadata["output_tokens"] == 12 and whole.usage_metadata["input_tokens"] > 10
    streamed = "".join(chunk.content for chunk in llm.stream(HI))
    assert streamed == whole.content


def test_completion_model_generates(server):
    llm = langchain_ollama.OllamaLLM(model="tiny", base_url=server.url, temperature=0, num_predict=8,
                                     client_kwargs={"headers": server.headers, "timeout": 60})
    text = llm.invoke("def add(a, b):")
    assert isinstance(text, str) and text == llm.invoke("def add(a, b):")


def test_structured_output_follows_the_schema(server):
    from pydantic import BaseModel

    class Answer(BaseModel):
        a: int

    llm = chat_model(server).model_copy(update={"num_predict": 64})
    got = llm.with_structured_output(Answer, method="json_schema").invoke(HI)
    assert isinstance(got, Answer)


def test_tools_are_offered_and_the_reply_parses(server):
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    reply = chat_model(server).bind_tools([get_weather]).invoke(HI)
    # the tiny model's noise may or may not call the tool; whichever, LangChain reads the reply
    assert reply.response_metadata["done_reason"] in ("length", "stop")
    for call in reply.tool_calls:
        assert call["name"] == "get_weather"


def test_an_unknown_model_is_a_clear_error(server):
    llm = langchain_ollama.ChatOllama(model="nope", base_url=server.url, validate_model_on_init=False,
                                      client_kwargs={"headers": server.headers, "timeout": 60})
    with pytest.raises(Exception) as err:
        llm.invoke(HI)
    assert "nope" in str(err.value)
