"""/infill through the real server, with the request bodies llama.vim and llama.vscode send
(copied from their sources: llama.vim autoload/llama.vim `llama#fim` and `s:ring_update`,
llama.vscode src/llama-server.ts `createRequestPayload`), and /v1/completions with `suffix`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, post, serve_args  # noqa: E402
from tiny_models import QWEN_FIM, write_tiny_model  # noqa: E402

pytestmark = pytest.mark.server

PREFIX = "def area(r):\n    pi = 3.14\n"
SUFFIX = "\n    return a\n\n\nprint(area(2))\n"
EXTRA = [{"text": "the cat sat on the mat\n", "time": 1733300000, "filename": "notes.txt"},
         {"text": "the dog ran\n", "time": 1733300001, "filename": "more.txt"}]
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]


def vim_fim(prompt: str, **over) -> dict:
    """llama.vim's FIM request (g:llama_config defaults: n_predict 128, stop_strings [], t_max_prompt_ms 500)."""
    return {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": prompt,
            "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "response_fields": VIM_FIELDS, **over}


def vim_warm() -> dict:
    """llama.vim's ring-buffer update: extra context only, to warm the cache."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": EXTRA, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}


def vscode_fim(prompt: str, n_predict: int = 128) -> dict:
    """llama.vscode's createRequestPayload(false, ...) with its defaults (max_parallel_completions 3)."""
    return {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": prompt,
            "n_predict": n_predict, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}


def vscode_warm(prompt: str) -> dict:
    """llama.vscode's createRequestPayload(true, ...): prepare the cache."""
    return {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": prompt,
            "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim_server")
    write_tiny_model(d / "tiny.gguf", seed=1, control_tokens=QWEN_FIM)
    write_tiny_model(d / "tiny_draft.gguf", seed=1, noise=0.05, noise_seed=7, control_tokens=QWEN_FIM)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "1"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def test_llama_vim_bodies_warm_then_complete_from_the_cache(fim_server):
    assert post(fim_server, "/infill", vim_warm()) == {}  # response_fields [""]: nothing
    first = post(fim_server, "/infill", vim_fim("    a = "))
    assert sorted(first) == sorted(VIM_FIELDS) and isinstance(first["content"], str)
    assert first["truncated"] is False
    # the warm-up cached the extra context: the FIM request evaluated only what follows it
    assert first["tokens_cached"] >= 10 and first["timings/prompt_n"] > 0
    # the next keystroke extends the prompt by a character: only the new tokens are evaluated
    second = post(fim_server, "/infill", vim_fim("    a = p"))
    assert second["timings/prompt_n"] <= 3
    assert second["tokens_cached"] >= first["tokens_cached"] + first["timings/prompt_n"] - 2


def test_llama_vscode_bodies(fim_server):
    warm = post(fim_server, "/infill", vscode_warm("    a = "))
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["stop_type"] == "limit"
    outs = post(fim_server, "/infill", vscode_fim("    a = "))  # n_cmpl 3: three completions, as llama-server
    assert [o["index"] for o in outs] == [0, 1, 2] and len({o["content"] for o in outs}) == 1  # greedy: the same
    out = outs[0]
    assert isinstance(out["content"], str) and out["tokens_cached"] == out["tokens_evaluated"] - 1
    assert out["timings"]["prompt_n"] == 1 and out["timings"]["cache_n"] == out["tokens_cached"]
    assert {"truncated", "stop_type", "tokens_predicted", "timings"} <= set(out)


def test_n_cmpl_answers_that_many_completions_sampled_ones_each_their_own(tmp_path):
    """Issue 63: llama.vscode's n_cmpl 3 got one completion, where llama-server answers an array of 3."""
    write_tiny_model(tmp_path / "tiny.gguf", seed=1, control_tokens=QWEN_FIM)
    write_tiny_model(tmp_path / "tiny_draft.gguf", seed=1, noise=0.05, noise_seed=7, control_tokens=QWEN_FIM)
    srv = ServerProcess(serve_args(tmp_path, "-c", "1024", "--parallel", "3"), tmp_path / "serve.log")
    try:
        body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    a", "n_predict": 12, "n_cmpl": 3,
                "temperature": 1.0, "seed": 5, "ignore_eos": True, "samplers": ["temperature"]}
        outs = post(srv, "/infill", body)
        assert [o["index"] for o in outs] == [0, 1, 2] and len({o["content"] for o in outs}) > 1
        again = post(srv, "/infill", body)
        assert [o["content"] for o in again] == [o["content"] for o in outs]  # seed + i for the i-th: reproduces
        with srv.client() as c:
            r = c.post("/infill", json={**body, "n_cmpl": 4})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n_cmpl"  # more than the slots
    finally:
        assert srv.stop() == 0


def test_greedy_infill_with_speculation_equals_the_target_alone(fim_server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    a", "n_predict": 32, "temperature": 0,
            "ignore_eos": True}
    alone = post(fim_server, "/infill", {**body, "speculative": {"mode": "none"}})
    for mode in ("draft", "ngram", "auto"):
        spec = post(fim_server, "/infill", {**body, "speculative": {"mode": mode}})
        assert spec["content"] == alone["content"], mode
    assert alone["tokens_predicted"] == 32


def test_openai_suffix_is_the_same_fill_in_the_middle(fim_server):
    infill = post(fim_server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12,
                                          "temperature": 0, "ignore_eos": True})
    oai = post(fim_server, "/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12,
                                               "temperature": 0, "ignore_eos": True})
    assert oai["choices"][0]["text"] == infill["content"]


def test_openai_suffix_heals_the_cursor_line_as_infill_does(fim_server):
    """A prompt that ends inside a line: that line goes after FIM_MID and is healed, as /infill's
    `prompt`; the token trace still concatenates to the text (the healed bytes are in neither)."""
    infill = post(fim_server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    a",
                                          "n_predict": 12, "temperature": 0, "ignore_eos": True})
    oai = post(fim_server, "/v1/completions", {"prompt": PREFIX + "    a", "suffix": SUFFIX, "max_tokens": 12,
                                               "temperature": 0, "ignore_eos": True, "speculative": {"trace": True}})
    choice = oai["choices"][0]
    assert choice["text"] == infill["content"]
    assert "".join(run["text"] for run in choice["speculative_trace"]) == choice["text"]


@pytest.mark.parametrize("body, param", [
    ({"input_extra": [{"filename": 3, "text": "x"}]}, "input_extra[0]"),
    ({"input_extra": "x"}, "input_extra"),
    ({"input_extra": [{"filename": "ok"}]}, "input_extra[0]"),  # a chunk without its text, as llama-server
    ({"input_prefix": 5}, "input_prefix"),
    ({"n_indent": -1}, "n_indent"),
    ({"id_slot": -7}, "id_slot"),  # a slot number counts round the slots (llama-server), a negative is refused
    ({"n_cmpl": 2, "temperature": 0.7, "samplers": ["top_k", "temperature"]}, "n_cmpl"),
    ({"samplers": ["top_k", "mirostat"]}, "samplers"),
])
def test_bad_fields_get_400_naming_them(fim_server, body, param):
    with fim_server.client() as c:
        r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_model_without_fim_tokens_is_refused_with_the_reason(tmp_path):
    write_tiny_model(tmp_path / "plain.gguf", seed=1)
    srv = ServerProcess(["-m", str(tmp_path / "plain.gguf"), "-t", "1", "-c", "512", "--parallel", "1"],
                        tmp_path / "serve.log")
    try:
        with srv.client() as c:
            for path, body in (("/infill", {"input_prefix": "a", "input_suffix": "b"}),
                               ("/v1/completions", {"prompt": "a", "suffix": "b"})):
                r = c.post(path, json=body)
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["code"] == "infill_not_supported" and "no FIM prefix token (<|fim_prefix|>" in err["message"]
    finally:
        assert srv.stop() == 0


def test_a_streamed_infill_is_llama_servers_stream_with_the_same_text(fim_server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    a", "n_predict": 16, "temperature": 0}
    whole = post(fim_server, "/infill", body)
    with fim_server.client() as c, c.stream("POST", "/infill", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"] and "timings" in events[-1]
