"""build_request (server/apis/shared/builder.py): each API's body -> GenRequest as a table, on a tiny model
and no server; the rules once copied per API (refused fields, id_slot, stop strings, the key's scope, a warm
request, a continued assistant message), now one behaviour on every API; and the checks of a body alone
that once needed a server (fields refused or passed, a chat message's shape)."""
from __future__ import annotations

import asyncio

import pytest

from specserve.backends import load_model
from specserve.grammar import GrammarWorker
from specserve.prompt import chat_tokens
from specserve.server.apis.anthropic.request import MESSAGES
from specserve.server.apis.llama.request import INFILL, LLAMA
from specserve.server.apis.ollama.request import CHAT as OLLAMA_CHAT
from specserve.server.apis.ollama.request import GENERATE as OLLAMA_GENERATE
from specserve.server.apis.openai.request import CHAT, COMPLETIONS, RESPONSES
from specserve.server.apis.shared.builder import ServerView, build_request
from specserve.server.core.model_presets import Profile
from specserve.server.http.errors import ApiError
from tiny_models import QWEN_FIM, write_tiny_model

N_CTX, N_SLOTS = 512, 4
HI = [{"role": "user", "content": "hi"}]
# each API, and the least body it answers
APIS = {
    "chat": (CHAT, {"messages": HI}),
    "completions": (COMPLETIONS, {"prompt": "hi"}),
    "llama": (LLAMA, {"prompt": "hi"}),
    "infill": (INFILL, {"input_prefix": "def f(", "input_suffix": "):\n"}),
    "messages": (MESSAGES, {"max_tokens": 8, "messages": HI}),
    "responses": (RESPONSES, {"input": "hi"}),
    "ollama_chat": (OLLAMA_CHAT, {"model": "tiny", "messages": HI}),
    "ollama_generate": (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi"}),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny model with a chat template (ChatML) and FIM tokens, so every API's prompt can be built."""
    path = write_tiny_model(tmp_path_factory.mktemp("builder") / "fim.gguf", seed=1, control_tokens=QWEN_FIM)
    model = load_model(str(path), n_threads=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def grammars():
    worker = GrammarWorker()
    yield worker
    worker.close()


@pytest.fixture
def build(target, grammars):
    def build(api, body: dict, key_scope: str | None = None):
        view = ServerView(target, target.grammar_tokenizer, grammars, N_CTX, N_SLOTS, has_draft=False,
                          profiles={"tiny": Profile("tiny")}, model_name="tiny", key_scope=key_scope)
        return asyncio.run(build_request(api, body, view))
    return build


def refused(build, api, body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        build(api, body)
    assert e.value.status == 400
    return e.value


# (API, body, what the GenRequest holds)
TABLE = [
    ("chat", {"messages": HI, "max_tokens": 7, "temperature": 0, "stop": ["x"], "id_slot": 5},
     {"endpoint": "chat", "messages": HI, "limit": "max_tokens=7", "id_slot": 1, "continue_final": False,
      "sampling.max_tokens": 7, "sampling.stop": ("x",), "sampling.greedy": True, "prompt": None}),
    ("chat", {"messages": HI, "max_completion_tokens": 3, "max_tokens": 9},
     {"limit": "max_completion_tokens=3", "sampling.max_tokens": 3}),
    ("chat", {"messages": HI, "n_predict": -1}, {"limit": None, "sampling.max_tokens": N_CTX}),
    ("chat", {"messages": [*HI, {"role": "assistant", "content": '{"name": "ZQX'}]},
     {"continue_final": True}),
    ("chat", {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}, "reasoning_format": "none",
              "thinking_budget_tokens": 0},
     {"template_kwargs": {"enable_thinking": False}, "reasoning_format": "none", "reasoning_budget": 0}),
    ("chat", {"messages": HI, "cache_prompt": False, "stream": True}, {"cache_prompt": False, "stream": True}),
    ("completions", {"prompt": "hi"},
     {"endpoint": "completions", "prompt": "hi", "messages": None, "sampling.max_tokens": 16,
      "limit": "max_tokens=16 (the default)"}),
    ("completions", {"prompt": [1, 2, 3], "max_tokens": 4, "seed": 5}, {"prompt": [1, 2, 3], "sampling.seed": 5}),
    ("llama", {"prompt": "hi", "n_predict": -1, "seed": -1},
     {"endpoint": "llama", "prompt": "hi", "limit": None, "sampling.seed": None}),
    ("llama", {"prompt": ["a", "b"], "max_tokens": 5}, {"prompt": "a", "limit": "max_tokens=5"}),
    ("llama", {"prompt": "hi", "speculative.n_max": 4}, {"spec.draft_max": 4}),
    ("infill", {"input_prefix": "x = ", "samplers": ["top_k", "infill"], "temperature": 0.8, "n_predict": 9},
     {"endpoint": "infill", "sampling.greedy": True, "limit": "n_predict=9", "warm": False}),
    ("messages", {"max_tokens": 8, "system": "be brief", "messages": HI, "stop_sequences": ["END"],
                  "thinking": {"type": "disabled"}},
     {"endpoint": "messages", "messages": [{"role": "system", "content": "be brief"}, *HI], "limit": "max_tokens=8",
      "sampling.stop": ("END",), "reasoning_budget": 0}),
    ("responses", {"input": "hi", "instructions": "be brief", "max_output_tokens": 6,
                   "reasoning": {"effort": "none"}},
     {"endpoint": "responses", "messages": [{"role": "system", "content": "be brief"}, *HI],
      "limit": "max_output_tokens=6", "reasoning_budget": 0}),
    ("responses", {"input": "hi"}, {"limit": None, "sampling.max_tokens": N_CTX, "id_slot": -1}),
    # Ollama: stream unless false, sampling from `options`, num_predict -1 and -2 no limit, seed -1 random
    ("ollama_chat", {"model": "tiny", "messages": HI},
     {"endpoint": "ollama_chat", "messages": HI, "stream": True, "limit": None, "sampling.max_tokens": N_CTX}),
    ("ollama_chat", {"model": "tiny:latest", "messages": HI, "stream": False, "think": False, "keep_alive": "5m",
                     "options": {"temperature": 0, "top_k": 5, "num_predict": 7, "stop": ["x"], "seed": 3,
                                 "repeat_penalty": 1.1, "num_ctx": 256, "num_gpu": 99, "num_thread": 2}},
     {"stream": False, "limit": "num_predict=7", "sampling.max_tokens": 7, "sampling.stop": ("x",),
      "sampling.greedy": True, "sampling.seed": 3, "sampling.repeat_penalty": 1.1, "reasoning_budget": 0}),
    ("ollama_chat", {"model": "tiny", "messages": HI, "options": {"num_predict": -2, "seed": -1}, "think": "high"},
     {"limit": None, "sampling.seed": None, "reasoning_format": "auto", "reasoning_budget": None}),
    ("ollama_chat", {"model": "tiny", "messages": [
        *HI, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "2", "tool_name": "f"}, {"role": "assistant", "content": "It is"}]},
     {"messages": [*HI, {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "2", "tool_call_id": "call_1", "name": "f"},
        {"role": "assistant", "content": "It is"}], "continue_final": True}),
    ("ollama_generate", {"model": "tiny", "prompt": "hi", "system": "be brief", "options": {"num_predict": 4}},
     {"endpoint": "ollama_generate", "prompt": None, "limit": "num_predict=4",
      "messages": [{"role": "system", "content": "be brief"}, *HI]}),
    ("ollama_generate", {"model": "tiny", "prompt": "hi", "raw": True}, {"prompt": "hi", "messages": None}),
]


def value_at(req, path: str):
    for part in path.split("."):
        req = getattr(req, part)
    return req


@pytest.mark.parametrize("name,body,expected", TABLE, ids=[f"{t[0]}-{i}" for i, t in enumerate(TABLE)])
def test_body_to_request(build, name, body, expected):
    req, _ = build(APIS[name][0], body)
    assert {path: value_at(req, path) for path in expected} == expected


def test_fim_prompts_are_laid_out_with_the_models_tokens(build, target):
    """/infill and /v1/completions with `suffix` run on token ids, their cursor's line healed."""
    pre = target.vocab.token_texts.index("<|fim_prefix|>")
    for api, body in ((INFILL, {"input_prefix": "a\nb", "input_suffix": "c"}), (COMPLETIONS, {"prompt": "a\nb",
                                                                                         "suffix": "c"})):
        req, _ = build(api, body)
        assert isinstance(req.prompt, list) and pre in req.prompt and req.sampling.heal is not None


def test_several_llama_prompts_are_kept_for_the_endpoint(build):
    _, fields = build(LLAMA, {"prompt": ["a", [1, 2], {"prompt_string": "c"}]})
    assert fields.prompts == ["a", [1, 2], "c"]


@pytest.mark.parametrize("fmt", ["json", {"type": "object", "properties": {"a": {"type": "integer"}}}])
def test_ollamas_format_becomes_the_requests_grammar(build, fmt):
    req, _ = build(OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "format": fmt})
    assert req.sampling.grammar is not None
    req, _ = build(OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "format": ""})
    assert req.sampling.grammar is None


def test_ollamas_tools_are_the_requests_tools(build):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "now", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    req, _ = build(OLLAMA_CHAT, {"model": "tiny", "messages": HI, "tools": tools})
    assert req.tools is not None and req.sampling.grammar is not None


# Ollama's refusals: (API, body, status, the field named)
OLLAMA_REFUSED = [
    (OLLAMA_CHAT, {"model": "llama3", "messages": HI}, 404, "model"),
    (OLLAMA_CHAT, {"messages": HI}, 400, "model"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400,
     "messages[0].images"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "options": {"num_ctx": N_CTX + 1}}, 400, "options.num_ctx"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "options": {"temperature": "hot"}}, 400, "options.temperature"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "options": {"mirostat": 2}}, 400, "options.mirostat"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "temperature": 0}, 400, "temperature"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "format": "yaml"}, 400, "format"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": HI, "think": "very"}, 400, "think"),
    (OLLAMA_CHAT, {"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "images": ["aGk="]}, 400, "images"),
    (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "context": [1, 2]}, 400, "context"),
    (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "template": "{{ .Prompt }}"}, 400, "template"),
    (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "raw": True, "system": "x"}, 400, "system"),
    (OLLAMA_GENERATE, {"model": "tiny", "prompt": "hi", "tools": [{"type": "function"}]}, 400, "tools"),
]


@pytest.mark.parametrize("api,body,status,param", OLLAMA_REFUSED, ids=[r[3] for r in OLLAMA_REFUSED])
def test_ollama_refusals_name_the_field(build, api, body, status, param):
    with pytest.raises(ApiError) as e:
        build(api, body)
    assert (e.value.status, e.value.param) == (status, param)


def test_a_constraint_becomes_the_requests_grammar(build):
    req, _ = build(COMPLETIONS, {"prompt": "hi", "response_format": {"type": "json_object"}})
    assert req.sampling.grammar is not None


# The drift once found between the copies, each now one behaviour on every API.

REFUSED_EVERYWHERE = [("mirostat", 2), ("top_n_sigma", 3.0), ("verify", "rejection"), ("draft_max", 4),
                      ("best_of", 2), ("functions", [{"name": "f"}])]


@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("key,value", REFUSED_EVERYWHERE, ids=[k for k, _ in REFUSED_EVERYWHERE])
def test_every_api_refuses_what_it_does_not_implement(build, name, key, value):
    """/v1/messages once let mirostat, a top-level `verify` or `draft_max` through, answering without them."""
    api, body = APIS[name]
    err = refused(build, api, {**body, key: value})
    assert (err.param, err.code) == (key, "unsupported_parameter")


@pytest.mark.parametrize("name", ["messages", "responses"])
@pytest.mark.parametrize("key,value", [("n", 2), ("logprobs", True), ("n_probs", 3), ("top_logprobs", 2)])
def test_fields_an_api_lacks_are_refused(build, name, key, value):
    api, body = APIS[name]
    assert refused(build, api, {**body, key: value}).param == key


@pytest.mark.parametrize("name", APIS)
def test_id_slot_is_read_on_every_api(build, name):
    """/v1/messages and /v1/responses once accepted id_slot and ran on any slot; -5 answered 200."""
    api, body = APIS[name]
    req, _ = build(api, {**body, "id_slot": N_SLOTS + 2})
    assert req.id_slot == 2  # counted round the slots, as llama-server does
    assert refused(build, api, {**body, "id_slot": -5}).param == "id_slot"


def test_stop_sequences_and_stop_share_one_limit(build):
    """/v1/messages once took 16 `stop` and 16 `stop_sequences`: 32 strings where every API stops at 16."""
    api, body = APIS["messages"]
    many = {**body, "stop": [f"s{i}" for i in range(10)], "stop_sequences": [f"t{i}" for i in range(10)]}
    assert refused(build, api, many).param == "stop_sequences"
    req, _ = build(api, {**body, "stop": ["a"] * 10, "stop_sequences": ["a", *(f"t{i}" for i in range(15))]})
    assert len(req.sampling.stop) == 16  # the same string in both counts once


@pytest.mark.parametrize("name", APIS)
def test_the_keys_scope_confines_every_api(build, name):
    api, body = APIS[name]
    req, _ = build(api, body, key_scope="team-a")
    assert req.spec.cross_request_scope == "team-a"
    with pytest.raises(ApiError) as e:
        build(api, {**body, "speculative": {"cross_request_scope": "team-b"}}, key_scope="team-a")
    assert e.value.code == "pinned_parameter"


@pytest.mark.parametrize("name", ["chat", "infill"])
def test_a_warm_request_is_one_rule(build, name):
    """`n_predict: 0` puts the prompt in a slot's caches: its sampling fields are not read, on chat as on
    /infill (chat once read all of them but `samplers`, and refused mirostat or a bad temperature)."""
    api, body = APIS[name]
    warm = {**body, "n_predict": 0, "samplers": ["xtc", "bogus"], "mirostat": 2, "temperature": "hot",
            "logit_bias": "x", "id_slot": 1, "cache_prompt": True}
    req, _ = build(api, warm)
    assert (req.warm, req.sampling.max_tokens, req.id_slot, req.cache_prompt) == (True, 1, 1, True)


def test_infill_n_cmpl_is_counted_once_by_the_builder(build):
    """Issue 63's n_cmpl (an array of that many completions) over builder's INFILL: sampled ones up to the
    slots, a greedy request's copies up to MAX_GREEDY_COPIES, one when streamed; logit_bias text is kept
    for tokenizing off the event loop."""
    from specserve.server.apis.llama.request import MAX_GREEDY_COPIES
    _, body = APIS["infill"]
    sampled = {**body, "temperature": 0.7, "samplers": ["temperature"]}
    _, fields = build(INFILL, {**sampled, "n_cmpl": N_SLOTS})
    assert fields.n_cmpl == N_SLOTS
    assert refused(build, INFILL, {**sampled, "n_cmpl": N_SLOTS + 1}).param == "n_cmpl"
    build(INFILL, {**body, "temperature": 0, "n_cmpl": MAX_GREEDY_COPIES})
    assert refused(build, INFILL, {**body, "temperature": 0, "n_cmpl": MAX_GREEDY_COPIES + 1}).param == "n_cmpl"
    assert refused(build, INFILL, {**body, "n_cmpl": 0}).param == "n_cmpl"
    err = refused(build, INFILL, {**body, "temperature": 0, "n_cmpl": 2, "stream": True})
    assert (err.param, err.code) == ("n_cmpl", "unsupported_parameter")
    req, _ = build(INFILL, {**body, "logit_bias": {"12": -1, "abc": 2}})
    assert req.sampling.logit_bias == ((12, -1.0),) and req.sampling.bias_text == (("abc", 2.0),)


def test_completion_does_not_warm(build):
    """llama-server's /completion refuses n_predict 0; only chat and /infill (llama.vim's) warm a slot."""
    assert refused(build, LLAMA, {"prompt": "hi", "n_predict": 0}).param == "n_predict"


def test_anthropic_needs_max_tokens(build):
    assert refused(build, MESSAGES, {"messages": HI}).param == "max_tokens"


@pytest.mark.parametrize("content", ['{"name": "ZQX', [{"type": "text", "text": '{"name": "ZQX'}]])
def test_anthropic_continues_a_final_assistant_message(build, target, content):
    """As Anthropic's API does (prefill): the answer begins where the assistant's text stops, not in a new turn."""
    req, _ = build(MESSAGES, {"max_tokens": 8, "messages": [*HI, {"role": "assistant", "content": content}]})
    assert req.continue_final
    prompt = target.detokenize(chat_tokens(target, req.messages, None, req.continue_final)).decode()
    assert prompt.endswith('{"name": "ZQX')


# Field checks of a body alone, moved here from test_request_fields_server.py: no server needed.

C, CH, L = COMPLETIONS, CHAT, LLAMA
REFUSED = [
    (CH, {"functions": [{"name": "f"}]}, "functions"),
    (CH, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
     "messages[0].content[1]"),
    (C, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    (L, {"typical_p": 0.5}, "typical_p"),
    (L, {"dry_multiplier": 0.8}, "dry_multiplier"),
    (C, {"top_logprobs": 2}, "top_logprobs"),  # chat's field: completions takes logprobs, a number
]
NEUTRAL = [
    (CH, {"response_format": {"type": "text"}, "tool_choice": "auto", "tools": []}),
    (CH, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    (L, {"typical_p": 1.0, "n_probs": 0, "grammar": "", "mirostat": 0}),
]


def _base(api) -> dict:
    return {"messages": HI, "max_tokens": 2} if api is CH else {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("api,fields,param", REFUSED, ids=[f"{a.endpoint}-{p}" for a, _, p in REFUSED])
def test_unimplemented_fields_are_refused(build, api, fields, param):
    err = refused(build, api, {**_base(api), **fields})
    assert (err.code, err.param) == ("unsupported_parameter", param)


@pytest.mark.parametrize("api,fields", NEUTRAL, ids=[a.endpoint for a, _ in NEUTRAL])
def test_neutral_values_of_unimplemented_fields_pass(build, api, fields):
    build(api, {**_base(api), **fields})


@pytest.mark.parametrize("messages,param,code", [
    ([{"role": "hacker", "content": "hi"}], "messages[0].role", "invalid_value"),
    ([{"role": "user"}], "messages[0].content", "missing_required_parameter"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], "messages[1].content",
     "missing_required_parameter"),
    ([{"content": "hi"}], "messages[0].role", "missing_required_parameter"),
    ([{"role": 7, "content": "hi"}], "messages[0].role", "invalid_value"),
    ([{"role": "user", "content": 7}], "messages[0].content", None),
    ([{"role": "tool", "content": "42"}], "messages[0].tool_call_id", "missing_required_parameter"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                             "function": {"name": "f", "arguments": "{x"}}]}],
     "messages[0].tool_calls[0].function.arguments", "invalid_value"),
], ids=["unknown-role", "no-content", "assistant-null-content", "no-role", "role-not-a-string",
        "content-not-a-string", "tool-without-its-call-id", "tool-call-arguments-not-json"])
def test_bad_messages_are_400_naming_the_field(build, messages, param, code):
    err = refused(build, CH, {"messages": messages, "max_tokens": 2})
    assert (err.param, err.code) == (param, code)


@pytest.mark.parametrize("fields,param", [
    ({"n_keep": 8}, "n_keep"), ({"t_max_predict_ms": 500}, "t_max_predict_ms"),
    ({"samplers": ["top_k", "mirostat", "temperature"]}, "samplers"),
    ({"samplers": ["top_k", "top_p"]}, "samplers"),  # no temperature: llama-server samples at 1
    ({"samplers": ["temperature", "top_p", "top_p"]}, "samplers"),
    ({"samplers": ["top_k", "top_p", "min_p", "temperature"], "temperature": 0.8, "top_p": 0.9}, "samplers"),
    ({"samplers": "kpmt", "temperature": 0.8, "top_p": 0.9}, "samplers"),
    ({"samplers": 7}, "samplers"),
], ids=["n_keep", "t_max_predict_ms", "unknown-sampler", "no-temperature", "twice",
        "temperature-last", "letters-temperature-last", "not-a-list"])
def test_llama_fields_we_cannot_honour_are_refused(build, fields, param):
    err = refused(build, L, {"prompt": "the cat", "n_predict": 2, **fields})
    code = None if fields.get("samplers") == 7 else "unsupported_parameter"
    assert (err.param, err.code) == (param, code)


@pytest.mark.parametrize("fields", [
    {"id_slot": -1, "n_keep": 0, "t_max_predict_ms": 0}, {"n_keep": -1}, {"id_slot": 0},
    {"samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]},
    {"samplers": "edkypmxt", "temperature": 0.8, "top_k": 40},  # top-k commutes with temperature
    {"samplers": ["temperature", "top_k", "top_p", "min_p"], "temperature": 0.8, "top_p": 0.9, "min_p": 0.05},
], ids=["neutral", "n_keep-1", "id_slot", "llama-default-greedy", "letters-top-k", "our-order"])
def test_llama_fields_that_mean_what_we_do_pass(build, fields):
    build(L, {"prompt": "the cat", "n_predict": 2, **fields})
