"""Logprobs, logit_bias and the penalties through the server, on the tiny pair with speculation on: each
API's shape (OpenAI chat's `logprobs.content`, whole and streamed; OpenAI's legacy completions shape;
llama-server's `n_probs` / `completion_probabilities`, one token a streamed chunk as llama-server sends
them, and `post_sampling_probs`), each token's entry matching the text and tokens of the answer, the
streamed ones the whole answer's; logit_bias in OpenAI's and llama-server's forms keeping tokens out;
the penalties changing what is chosen; and a 400 naming the field for what cannot be served."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, events, post, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

MSG = [{"role": "user", "content": "Tell me a story about a cat."}]
PROMPT = "Once upon a time, a cat"


@pytest.fixture(scope="module")
def http(tiny_models_dir, tmp_path_factory):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "512", "--spec", "draft", "--draft-max", "4"),
                        tmp_path_factory.mktemp("logprobs") / "serve.log")
    try:
        with srv.client() as c:
            yield c
    finally:
        assert srv.stop() == 0


def _text(entries: list[dict]) -> str:
    """The text the entries' tokens make (the tiny model writes byte tokens that are not whole UTF-8)."""
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace")


def _check_entry(e: dict, n_top: int) -> None:
    assert bytes(e["bytes"]).decode("utf-8", "replace").startswith(e["token"]) and e["logprob"] <= 0
    assert len(e["top_logprobs"]) == n_top
    values = [t["logprob"] for t in e["top_logprobs"]]
    assert values == sorted(values, reverse=True)
    # the chosen token is among its alternatives where it was the most likely (greedy)
    assert e["top_logprobs"][0]["id"] == e["id"] and e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"])


def test_chat_logprobs_whole_and_streamed_are_one_per_token_and_agree(http):
    body = {"messages": MSG, "max_tokens": 20, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    choice = post(http, "/v1/chat/completions", body)["choices"][0]
    content = choice["logprobs"]["content"]
    assert 0 < len(content) <= 20 and _text(content) == choice["message"]["content"]
    for e in content:
        _check_entry(e, 3)
    streamed, text = [], ""
    # the first chunk: the role, logprobs null
    for chunk in events(http, "/v1/chat/completions", {**body, "stream": True})[1:]:
        for c in chunk["choices"]:
            text += c["delta"].get("content") or ""
            if c["finish_reason"] is None:
                assert c["logprobs"] is not None
            streamed += (c["logprobs"] or {}).get("content", [])
    assert text == choice["message"]["content"]
    assert [e["id"] for e in streamed] == [e["id"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-2)
    without = post(http, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert without["choices"][0]["logprobs"] is None


def test_completions_logprobs_take_openais_legacy_shape(http):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    choice = post(http, "/v1/completions", body)["choices"][0]
    lp = choice["logprobs"]
    n = len(lp["tokens"])
    assert 1 <= n <= 12 and len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n, lp
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(value)  # greedy: the most likely
    # the same request on /completion: the same tokens and values, in llama-server's shape
    same = post(http, "/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "n_probs": 2,
                                       "ignore_eos": True})
    probs = same["completion_probabilities"]
    assert same["content"] == choice["text"] and len(probs) == n
    # a token's name is its text, or its bytes written out where they are not whole UTF-8
    assert lp["tokens"] == [p["token"] if bytes(p["bytes"]).decode("utf-8", "replace") == p["token"]
                            else "bytes:" + "".join(f"\\x{b:02x}" for b in p["bytes"]) for p in probs]
    assert lp["token_logprobs"] == pytest.approx([p["logprob"] for p in probs], abs=1e-2)
    streamed = [c["choices"][0] for c in events(http, "/v1/completions", {**body, "stream": True}) if c["choices"]]
    assert sum((c["logprobs"]["tokens"] for c in streamed if c["logprobs"]), []) == lp["tokens"]


def test_n_probs_on_completion_whole_and_one_token_a_streamed_chunk(http):
    body = {"prompt": PROMPT, "n_predict": 10, "temperature": 0, "n_probs": 4, "return_tokens": True}
    whole = post(http, "/completion", body)
    probs = whole["completion_probabilities"]
    assert [p["id"] for p in probs] == whole["tokens"] and _text(probs) == whole["content"]
    for e in probs:
        _check_entry(e, 4)
    chunks = [c for c in events(http, "/completion", {**body, "stream": True}) if not c["stop"]]
    streamed = [p for c in chunks for p in c["completion_probabilities"]]
    assert [p["id"] for p in streamed] == whole["tokens"]
    # speculation commits several tokens a step; llama-server's stream sends one each, and so does this one
    assert all(len(c["completion_probabilities"]) == 1 for c in chunks)
    assert "completion_probabilities" not in post(http, "/completion", {**body, "n_probs": 0})


def test_post_sampling_probs_are_probabilities_of_the_distribution_sampled_from(http):
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 1.0, "top_k": 3, "seed": 7, "n_probs": 5,
            "post_sampling_probs": True}
    for e in post(http, "/completion", body)["completion_probabilities"]:
        assert 0 < e["prob"] <= 1 and "logprob" not in e
        top = e["top_probs"]
        assert 1 <= len(top) <= 3 and sum(t["prob"] for t in top) == pytest.approx(1, abs=1e-3)  # top-k 3 kept 3
        assert e["id"] in [t["id"] for t in top]


def test_logit_bias_in_each_form_keeps_the_tokens_out(http):
    base = {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "return_tokens": True}
    first = post(http, "/completion", base)["tokens"]
    banned = sorted(set(first[:4]))
    piece = post(http, "/detokenize", {"tokens": [first[0]]})["content"]
    for bias in ({str(t): -100 for t in banned}, [[t, False] for t in banned], [[t, -100] for t in banned]):
        out = post(http, "/completion", {**base, "logit_bias": bias})["tokens"]
        assert not set(out) & set(banned), bias
    by_text = post(http, "/completion", {**base, "logit_bias": [[piece, False]]})["tokens"]
    assert first[0] not in by_text
    chat = post(http, "/v1/chat/completions", {"messages": MSG, "max_tokens": 8, "temperature": 0, "logprobs": True})
    ids = [e["id"] for e in chat["choices"][0]["logprobs"]["content"]]
    biased = post(http, "/v1/chat/completions", {"messages": MSG, "max_tokens": 8, "temperature": 0, "logprobs": True,
                                                  "logit_bias": {str(ids[0]): -100}})
    assert ids[0] not in [e["id"] for e in biased["choices"][0]["logprobs"]["content"]]


def test_the_penalties_keep_seen_tokens_out_and_a_window_of_0_turns_them_off(http):
    prompt_ids = post(http, "/tokenize", {"content": PROMPT})["tokens"]
    base = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    x = next(t for t in post(http, "/completion", base)["tokens"] if t not in prompt_ids)
    base["logit_bias"] = [[x, 50]]  # x wins every position: the text repeats it
    assert post(http, "/completion", base)["tokens"] == [x] * 12
    for penalty in ({"presence_penalty": 1000.0}, {"frequency_penalty": 1000.0}, {"repeat_penalty": 1000.0}):
        out = post(http, "/completion", {**base, **penalty, "repeat_last_n": -1})["tokens"]
        assert out[0] == x and x not in out[1:], penalty
        if "presence_penalty" in penalty:  # every token seen in the prompt or the output is kept out
            seen = set(prompt_ids)
            for t in out:
                assert t not in seen
                seen.add(t)
        assert post(http, "/completion", {**base, **penalty, "repeat_last_n": 0})["tokens"] == [x] * 12


@pytest.mark.parametrize("path,fields,param", [
    ("/completion", {"n_probs": 21}, "n_probs"),
    ("/completion", {"logit_bias": [[10**9, -1]]}, "logit_bias[0]"),
    ("/completion", {"logit_bias": {"7": "low"}}, "logit_bias.7"),
    ("/completion", {"repeat_last_n": -2}, "repeat_last_n"),
    ("/completion", {"repeat_penalty": 0}, "repeat_penalty"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 2, "echo": True}, "logprobs"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(http, path, fields, param):
    body = {"messages": MSG} if "chat" in path else {"prompt": PROMPT}
    r = http.post(path, json={**body, "max_tokens": 2, **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
