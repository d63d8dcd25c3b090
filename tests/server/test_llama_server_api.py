"""llama-server's endpoints and fields on a real `specserve serve` started with llama-server's flags:
/props, /slots, /tokenize, /detokenize, /apply-template, the un-prefixed paths, the context clamp and
exceed_context_size_error, authentication_error, CORS for allowed origins, n > 1, echo, /completion's
batches and answer fields."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401

from specserve.chat_templates import HERMES  # noqa: E402

pytestmark = pytest.mark.server

KEY = "k-llama"
N_CTX = 1024
# llama-server's own command line, as its test suite starts it (the sampling defaults, a cap on tokens,
# flags for what this server always does)
LLAMA_FLAGS = ("-c", str(N_CTX), "-np", "2", "--temp", "0.8", "--seed", "42", "-n", "64", "--alias", "tiny-2,fim,code",
               "--tags", "chat,small", "--chat-template", "hermes", "--cors-origins", "localhost,http://web.example",
               "--jinja", "--metrics", "--cont-batching", "--kv-unified", "-b", "32", "-fa", "off", "--offline",
               "--slots", "--no-context-shift")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    srv = ServerProcess(serve_args(tiny_models_dir, *LLAMA_FLAGS), tmp_path_factory.mktemp("llama") / "serve.log",
                        api_key=KEY)
    yield srv
    assert srv.stop() == 0


@pytest.fixture()
def http(server):
    with server.client() as c:
        yield c


def test_props_tell_the_slot_context_the_defaults_the_template_and_the_build(http):
    p = http.get("/props").json()
    s = p["default_generation_settings"]
    assert s["n_ctx"] == N_CTX and p["total_slots"] == 2 and p["model_alias"] == "code"
    assert (s["params"]["seed"], s["params"]["temperature"], s["params"]["n_predict"]) == (42, 0.8, 64)
    assert s["params"]["speculative"]["mode"] == "auto" and s["params"]["speculative.n_max"] == 8
    assert p["model_path"] == "tiny.gguf" and p["draft_model_path"] == "tiny_draft.gguf"  # names, not paths
    assert p["draft_choice"] == {"mode": "given", "chosen": "tiny_draft", "file": "tiny_draft.gguf",
                                 "reason": "tiny_draft: given with -md", "excluded": [],
                                 "candidates": [{**p["draft_choice"]["candidates"][0], "name": "tiny_draft",
                                                 "reason": "given with -md", "excluded": None}]}
    assert p["chat_template"] == HERMES and p["build_info"].startswith("specserve ")
    assert p["endpoint_slots"] is True and p["is_sleeping"] is False


def test_models_list_every_alias_and_the_tags(http):
    for path in ("/v1/models", "/models"):
        (m,) = http.get(path).json()["data"]
        assert m["id"] == "code" and m["aliases"] == ["code", "fim", "tiny-2"] and m["tags"] == ["chat", "small"]


def test_slots_show_the_request_and_the_speculation_on_each_slot(http):
    r = http.post("/completion", json={"prompt": "the cat sat on", "n_predict": 12, "id_slot": 1,
                                       "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200 and r.json()["id_slot"] == 1, r.text
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == N_CTX for s in slots)
    one = slots[1]
    assert one["is_processing"] is False and one["next_token"][0] == {
        "has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
    assert one["params"]["n_predict"] == 12 and one["n_prompt_tokens"] == r.json()["tokens_evaluated"]
    spec = one["speculation"]
    assert spec["requests"] >= 1 and spec["tokens_generated"] >= 12
    assert spec["passes"] == sum(spec["drafter_steps"].values()) and spec["accepted"] <= spec["drafted"]


def test_tokenize_parses_control_tokens_unless_told_and_detokenize_writes_them(http):
    plain = http.post("/tokenize", json={"content": "hello"}).json()["tokens"]
    marked = http.post("/tokenize", json={"content": "<|im_start|>hello"}).json()["tokens"]
    literal = http.post("/tokenize", json={"content": "<|im_start|>hello", "parse_special": False}).json()["tokens"]
    assert marked[1:] == plain and len(literal) > len(marked)
    assert http.post("/detokenize", json={"tokens": marked}).json()["content"] == "<|im_start|>hello"
    pieces = http.post("/tokenize", json={"content": "<|im_start|>hello", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == marked and "".join(p["piece"] for p in pieces) == "<|im_start|>hello"
    mixed = http.post("/tokenize", json={"content": [marked[0], "hello"]}).json()["tokens"]
    assert mixed == marked
    assert http.post("/detokenize", json={"tokens": [10 ** 9]}).status_code == 400


def test_apply_template_renders_tools_prefill_and_the_generation_prompt(http):
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    p = http.post("/apply-template", json={"messages": msgs, "tools": [TOOL], "tool_choice": "auto"}).json()["prompt"]
    assert "<tools>" in p and '"get_weather"' in p and p.endswith("<|im_start|>assistant\n")
    p = http.post("/apply-template", json={"messages": msgs, "add_generation_prompt": False}).json()["prompt"]
    assert p.endswith("weather in Paris?<|im_end|>\n")
    p = http.post("/apply-template", json={"messages": [*msgs, {"role": "assistant", "content": "It is"}]}).json()
    assert p["prompt"].endswith("<|im_start|>assistant\nIt is")
    # text parts: a line each in a message, but a continued one's joined by a blank line, as llama-server renders
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    p = http.post("/apply-template", json={"messages": [{"role": "user", "content": parts},
                                                        {"role": "assistant", "content": parts}]}).json()["prompt"]
    assert "Wh\nill<|im_end|>" in p and p.endswith("<|im_start|>assistant\nWh\n\nill")
    bad = http.post("/apply-template", json={"messages": msgs, "add_generation_prompt": True,
                                             "continue_final_message": True})
    assert bad.status_code == 400
    n = http.post("/v1/chat/completions/input_tokens", json={"messages": msgs}).json()["input_tokens"]
    assert n == len(http.post("/tokenize", json={"content": http.post("/apply-template", json={
        "messages": msgs}).json()["prompt"]}).json()["tokens"])


def test_the_hermes_template_brings_tool_calls_to_a_model_whose_template_has_none(http):
    """The tiny model's own template is plain ChatML; --chat-template hermes gives it Qwen2.5's tool calls."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [tool], "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 200}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls" and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Rome")


def test_the_unprefixed_paths_answer_as_llama_server_routes_them(server, http):
    chat = http.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
    assert chat.json()["system_fingerprint"].startswith("b") and "timings" in chat.json()
    native = http.post("/completions", json={"prompt": "hi", "n_predict": 3})  # llama-server's /completion
    assert native.status_code == 200 and "content" in native.json() and "generation_settings" in native.json()
    assert httpx.get(server.url + "/v1/health").status_code == 200  # open without the key, as /health


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
def test_a_missing_or_bad_key_is_an_authentication_error(server, headers):
    r = httpx.post(server.url + "/completions", json={"prompt": "hi"}, headers=headers)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1", "http://[::1]:3000",
                                    "http://web.example"])
def test_an_allowed_origins_preflight_is_answered_as_llama_server_does(server, origin):
    r = httpx.options(server.url + "/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-credentials"] == "true" and r.headers["access-control-allow-headers"] == "*"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    r = httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 1},
                   headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", ["http://localhost.evil.example", "http://evil.example", "null"])
def test_other_origins_are_still_refused(server, origin):
    r = httpx.options(server.url + "/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_a_prompt_the_context_cannot_hold_is_exceed_context_size_error(http):
    long = [{"role": "user", "content": " the" * (N_CTX + 100)}]
    for body in ({"messages": long}, {"messages": long, "stream": True}):
        err = http.post("/v1/chat/completions", json=body).json()["error"]
        assert err["type"] == "exceed_context_size_error" and err["code"] == "context_length_exceeded"
        assert err["n_ctx"] == N_CTX and err["n_prompt_tokens"] > N_CTX and err["param"] == "messages"


def test_max_tokens_past_the_context_is_cut_to_what_fits(http):
    prompt = " the" * (N_CTX - 30)
    n_prompt = len(http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4096, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == N_CTX - n_prompt
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 4096, "ignore_eos": True}).json()
    assert r["truncated"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == N_CTX - n_prompt
    r = http.post("/completion", json={"prompt": "the", "n_predict": 4096, "ignore_eos": True}).json()
    assert r["tokens_predicted"] + r["tokens_evaluated"] == N_CTX and r["truncated"] is True  # -n: not a cap
    r = http.post("/completion", json={"prompt": "the", "ignore_eos": True}).json()
    assert r["tokens_predicted"] == 64 and r["truncated"] is False  # -n 64: the default


def test_n_gives_distinct_seeded_samples_and_greedy_copies(http):
    body = {"messages": [{"role": "user", "content": "tell me"}], "max_tokens": 12, "n": 2, "seed": 7,
            "temperature": 1.5, "ignore_eos": True}
    first = http.post("/v1/chat/completions", json=body).json()
    again = http.post("/v1/chat/completions", json=body).json()
    texts = [c["message"]["content"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1] and texts[0] != texts[1]
    assert texts == [c["message"]["content"] for c in again["choices"]]
    assert first["usage"]["completion_tokens"] == 24
    greedy = http.post("/v1/completions", json={"prompt": "a b", "max_tokens": 5, "n": 2, "temperature": 0}).json()
    assert len({c["text"] for c in greedy["choices"]}) == 1 and len(greedy["choices"]) == 2
    assert http.post("/v1/completions", json={"prompt": "a", "n": 2, "stream": True}).status_code == 400
    assert http.post("/v1/completions", json={"prompt": "a", "n": 3}).json()["error"]["param"] == "n"  # > the slots


def test_echo_puts_the_prompt_before_the_text(http):
    r = http.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 3, "echo": True, "temperature": 0})
    plain = http.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 3, "temperature": 0})
    assert r.json()["choices"][0]["text"] == "the cat" + plain.json()["choices"][0]["text"]


def test_id_slot_is_taken_on_every_endpoint(http):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 2})):
        r = http.post(path, json={**body, "id_slot": 1, "cache_prompt": True})
        assert r.status_code == 200, r.text
        assert http.post(path, json={**body, "id_slot": 5}).status_code == 200  # round the slots, as llama-server
        assert http.post(path, json={**body, "id_slot": -2}).json()["error"]["param"] == "id_slot"


def test_completion_takes_batches_mixed_prompts_and_shapes_its_answer(http):
    ids = http.post("/tokenize", json={"content": "the cat", "add_special": True}).json()["tokens"]
    greedy = {"n_predict": 4, "temperature": 0}
    one = http.post("/completion", json={"prompt": "the cat", **greedy, "return_tokens": True}).json()
    batch = http.post("/completion", json={"prompt": [ids, "the cat", {"prompt_string": "the cat"}], **greedy}).json()
    assert [b["index"] for b in batch] == [0, 1, 2] and {b["content"] for b in batch} == {one["content"]}
    assert len(one["tokens"]) == 4 and one["generation_settings"]["n_predict"] == 4
    assert one["prompt"] == "the cat" and isinstance(one["has_new_line"], bool)
    cat = http.post("/tokenize", json={"content": "cat"}).json()["tokens"]
    mixed = http.post("/completion", json={"prompt": [ids[0], "cat"], **greedy})
    assert mixed.status_code == 200 and mixed.json()["tokens_evaluated"] == 1 + len(cat)
    fields = http.post("/completion", json={"prompt": "the cat", **greedy,
                                            "response_fields": ["content", "generation_settings/n_predict"]}).json()
    assert fields == {"content": one["content"], "generation_settings/n_predict": 4}
    eos = http.post("/completion", json={"prompt": "the", "n_predict": 2, "ignore_eos": True}).json()
    assert eos["generation_settings"]["logit_bias"] and all(b["bias"] is None for b in eos["generation_settings"][
        "logit_bias"])
    media = http.post("/completion", json={"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}})
    assert media.status_code == 400


def test_json_object_takes_llama_servers_schema(http):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "response_format": {"type": "json_object", "schema": {"const": "42"}}}
    assert http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] == '"42"'
    bad = http.post("/v1/chat/completions", json={**body, "response_format": {"type": "json_object", "schema": 7}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format.schema"


def test_a_chat_stream_opens_with_the_role_and_no_text(http):
    with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "timings_per_token": True, "stream_options": {"include_usage": True}}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None} and "timings" not in chunks[0]
    assert chunks[-1]["choices"] == [] and "timings" in chunks[-1] and events[-1] == "[DONE]"


@pytest.mark.parametrize("flag,why", [(["--context-shift"], "context shift"), (["-ctk", "q8_0"], "KV cache"),
                                      (["--spec-type", "draft-eagle3"], "--spec-type")])
def test_llama_server_flags_it_cannot_honour_are_refused_with_the_reason(tiny_models_dir, flag, why):
    r = subprocess.run([sys.executable, "-m", "specserve", "serve", *serve_args(tiny_models_dir), *flag],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr, r.stderr


def test_no_slots_answers_501_a_template_file_is_read_and_vertex_predicts(tiny_models_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "think={{ enable_thinking }}")
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "128", "--no-slots", "--chat-template-file", str(template),
                                   "--reasoning", "off"), tmp_path / "serve.log", env={"AIP_MODE": "PREDICTION"})
    try:
        with srv.client() as c:
            assert c.get("/slots").status_code == 501
            hi = [{"role": "user", "content": "hi"}]
            assert c.post("/apply-template", json={"messages": hi}).json()["prompt"] == "[user] hi\nthink=False"
            on = c.post("/apply-template", json={"messages": hi, "chat_template_kwargs": {"enable_thinking": True}})
            assert on.json()["prompt"] == "[user] hi\nthink=True"  # the request's over --reasoning off
            bad = c.post("/v1/chat/completions", json={"messages": hi, "chat_template_kwargs": {"messages": []}})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"
            out = c.post("/predict", json={"instances": [
                {"@requestFormat": "chatCompletions", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
                {"@requestFormat": "completion", "prompt": "the cat", "n_predict": 2, "stream": True},
                {"max_tokens": 3}]}).json()["predictions"]
            assert out[0]["object"] == "chat.completion" and out[1]["tokens_predicted"] == 2
            assert out[2]["error"]["param"] == "instances[2]"
    finally:
        assert srv.stop() == 0


def test_predict_is_404_outside_vertex(http):
    assert http.post("/predict", json={"instances": []}).status_code == 404
