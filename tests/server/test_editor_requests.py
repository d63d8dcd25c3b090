"""The requests editors and clients send, replayed as they send them against a real `specserve serve` on its
default context of 4096 tokens: llama.vim's instruct mode, llama.vscode's agent, Continue's chat and
autocomplete (OpenAI-style and llama.cpp-style) with their defaults, and the official openai SDK."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

N_CTX = 4096  # specserve's default, and llama-server's usual one: the editors' max_tokens 4096 do not fit with a prompt
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    srv = ServerProcess(serve_args(tiny_models_dir, "-np", "2"), tmp_path_factory.mktemp("editors") / "serve.log")
    yield srv
    assert srv.stop() == 0


@pytest.fixture()
def http(server):
    with server.client() as c:
        yield c


def sse(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def test_llama_vim_instruct_warms_its_slot_then_streams_the_edit(http):
    """llama.vim's instruct mode (llama#inst and llama#inst_send): a warm-up with n_predict 0 and no samplers
    while the user types, then the request; id_slot is its request counter, past the slots."""
    messages = [{"role": "system", "content": "You are a text-editing assistant.\n--- SELECTION ---\n" + CODE},
                {"role": "user", "content": "INSTRUCTION: rename to subtract"}]
    warm = http.post("/v1/chat/completions", json={"id_slot": 3, "messages": messages, "samplers": [], "n_predict": 0,
                                                   "stream": False, "cache_prompt": True, "response_fields": [""]})
    assert warm.status_code == 200 and warm.json()["usage"]["completion_tokens"] == 0, warm.text
    chunks = sse(http, "/v1/chat/completions", {"id_slot": 3, "messages": messages, "min_p": 0.1, "temperature": 0.1,
                                                "samplers": ["min_p", "temperature"], "stream": True,
                                                "cache_prompt": True, "max_tokens": 16})
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the warm-up's prefix was reused


def test_llama_vscode_agent_reads_props_renders_tools_counts_tokens_and_reads_the_context_error(http):
    n_ctx = http.get("/props").json()["default_generation_settings"]["n_ctx"]
    assert n_ctx == N_CTX
    tools = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                                "parameters": {"type": "object",
                                                               "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "what does sub do?"}]
    prompt = http.post("/apply-template", json={"messages": messages, "tools": tools, "tool_choice": "auto"})
    assert prompt.status_code == 200 and prompt.json()["prompt"].endswith("<|im_start|>assistant\n")
    tokens = http.post("/tokenize", json={"content": prompt.json()["prompt"], "parse_special": True}).json()["tokens"]
    assert 0 < len(tokens) < n_ctx
    huge = [{"role": "user", "content": " the" * (n_ctx + 100)}]
    err = http.post("/v1/chat/completions", json={"messages": huge, "stream": True}).json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == n_ctx and err["n_prompt_tokens"] > n_ctx


def test_continue_chat_with_its_default_max_tokens_ends_at_the_context(http):
    """Continue's chat: its own model name, max_tokens 4096 (its default) on a 4096 context: generation runs
    until the context is full and says length, as llama-server does."""
    body = {"model": "qwen2.5-coder:1.5b", "messages": [{"role": "user", "content": "explain:\n" + CODE * 20}],
            "max_tokens": 4096, "stream": True, "ignore_eos": True}
    chunks = sse(http, "/v1/chat/completions", body)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX


def test_continue_openai_autocomplete_and_llama_cpp_autocomplete(http):
    fim = {"model": "qwen2.5-coder:1.5b", "prompt": CODE, "max_tokens": 4096, "temperature": 0.01,
           "stop": ["\n\n", "\ndef"], "stream": True}
    chunks = sse(http, "/v1/completions", fim)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # Continue's llama.cpp provider: /completion with n_predict and its sampling fields
    chunks = sse(http, "/completion", {"prompt": CODE, "stream": True, "n_predict": 4096, "temperature": 0.01,
                                       "top_k": 40, "top_p": 0.95, "min_p": 0.05, "stop": ["\n\n"]})
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] in ("eos", "word", "limit")
    mirostat = http.post("/completion", json={"prompt": CODE, "n_predict": 8, "mirostat": 2})
    assert mirostat.status_code == 400 and mirostat.json()["error"]["param"] == "mirostat"
    assert "verifying a draft" in mirostat.json()["error"]["message"]


def test_the_openai_sdk_with_its_own_model_name_n_and_a_stream(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "write a haiku"}]
    two = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8, n=2, temperature=1.0,
                                         seed=11)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].message.content != two.choices[1].message.content
    assert two.system_fingerprint and two.usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="gpt-4o-mini", messages=msgs, max_tokens=6, temperature=0, stream=True) if c.choices)
    whole = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=6, temperature=0)
    assert text == whole.choices[0].message.content
    legacy = client.completions.create(model="davinci-002", prompt="the cat", max_tokens=4, echo=True, temperature=0)
    assert legacy.choices[0].text.startswith("the cat")


def test_the_openai_sdk_reads_logprobs_logit_bias_and_penalties(server):
    """The fields the SDK's users send for scoring and steering (issue 49: logprobs failed on the SDK suite)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "write a haiku"}]
    chat = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=6, temperature=0,
                                          logprobs=True, top_logprobs=3, presence_penalty=0.5, frequency_penalty=0.2)
    content = chat.choices[0].logprobs.content
    assert content and all(t.logprob <= 0 and t.bytes and len(t.top_logprobs) == 3 for t in content)
    streamed = [t for c in client.chat.completions.create(
        model="gpt-4o-mini", messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
        presence_penalty=0.5, frequency_penalty=0.2, stream=True) if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content]
    assert [t.bytes for t in streamed] == [t.bytes for t in content]
    first = content[0].bytes
    with server.client() as http:
        tokens = http.post("/tokenize", json={"content": bytes(first).decode("utf-8", "replace")}).json()["tokens"]
    banned = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=6, temperature=0,
                                            logprobs=True, logit_bias={str(t): -100 for t in tokens})
    assert banned.choices[0].logprobs.content[0].bytes != first
    legacy = client.completions.create(model="davinci-002", prompt="the cat", max_tokens=4, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
