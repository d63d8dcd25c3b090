"""Embeddings through the real server: OpenAI's /v1/embeddings (the `openai` client, base64 as it asks),
llama-server's /embedding and /embeddings, Ollama's /api/embed (the official `ollama` client) and
/api/embeddings; each vector checked against llama-cpp-python's own Llama.embed on the same tiny model,
and generation going on beside them unchanged."""
from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import numpy as np
import pytest

import llama_cpp as C

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_pair  # noqa: E402

pytestmark = pytest.mark.server

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

TEXTS = ["the quick brown fox", "hello world, hello again"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")
    tiny_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "512"), d / "serve.log", api_key=API_KEY)
    srv.dir = d
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


@pytest.fixture(scope="module")
def expected(server):
    """Llama.embed's vectors (mean-pooled: the tiny model is a causal LM), raw and normalized."""
    llm = C.Llama(str(server.dir / "tiny.gguf"), embedding=True, pooling_type=C.LLAMA_POOLING_TYPE_MEAN,
                  n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, verbose=False)
    try:
        return ([np.asarray(v) for v in llm.embed(TEXTS)], [np.asarray(v) for v in llm.embed(TEXTS, normalize=True)])
    finally:
        llm.close()


def close(a, b) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float32), b, rtol=1e-4, atol=1e-5)


def test_openai_client_embeddings(server, expected):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY)
    out = client.embeddings.create(model="text-embedding-3-small", input=TEXTS)  # the client asks for base64
    assert [d.index for d in out.data] == [0, 1] and out.usage.prompt_tokens > 4
    for d, want in zip(out.data, expected[1]):
        close(d.embedding, want)
    floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float")
    close(floats.data[0].embedding, expected[1][0])
    short = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float", dimensions=8)
    assert len(short.data[0].embedding) == 8 and np.linalg.norm(short.data[0].embedding) == pytest.approx(1, 1e-5)


def test_llama_server_shapes(server, expected):
    with server.client() as http:
        one = http.post("/embedding", json={"content": TEXTS[0]}).json()
        assert one[0]["index"] == 0 and len(one[0]["embedding"]) == 1  # one row: pooled
        close(one[0]["embedding"][0], expected[1][0])
        raw = http.post("/embeddings", json={"input": TEXTS, "embd_normalize": -1}).json()
        close(raw[1]["embedding"][0], expected[0][1])
        tokens = http.post("/tokenize", json={"content": TEXTS[0], "add_special": True}).json()["tokens"]
        by_ids = http.post("/v1/embeddings", json={"input": tokens}).json()
        close(by_ids["data"][0]["embedding"], expected[1][0])
        assert by_ids["object"] == "list" and by_ids["data"][0]["object"] == "embedding"
        long = http.post("/v1/embeddings", json={"input": "word " * 600})
        assert long.status_code == 400 and "at most 512" in long.json()["error"]["message"]
        assert http.post("/v1/embeddings", json={"input": ""}).status_code == 400
        assert http.post("/embedding", json={}).status_code == 400
        many = http.post("/v1/embeddings", json={"input": ["a"] * 2049})
        assert many.status_code == 400 and "at most 2048" in many.json()["error"]["message"]


def test_ollama_client_embed_and_the_older_embeddings(server, expected):
    client = ollama.Client(host=server.url, headers=server.headers, timeout=60)
    out = client.embed(model="tiny", input=TEXTS)
    assert len(out.embeddings) == 2 and out.prompt_eval_count > 4
    for got, want in zip(out.embeddings, expected[1]):
        close(got, want)  # L2-normalized, as Ollama's
    assert len(client.embed(model="tiny:latest", input="").embeddings) == 0
    short = client.embed(model="tiny", input=TEXTS[0], dimensions=8).embeddings[0]
    close(short, expected[0][0][:8] / np.linalg.norm(expected[0][0][:8]))  # the first 8, normalized again
    older = client.embeddings(model="tiny", prompt=TEXTS[1])
    close(older.embedding, expected[0][1])  # as the model gives it, as Ollama's older endpoint
    cut = client.embed(model="tiny", input="word " * 600)  # truncated, as Ollama by default
    assert len(cut.embeddings[0]) == 64
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input="word " * 600, truncate=False)
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="llama3.2", input="hi")
    assert e.value.status_code == 404 and "not found" in e.value.error


def test_generation_beside_embeddings_is_unchanged(server, expected):
    body = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "cache_prompt": False}
    with server.client() as http:
        alone = http.post("/completion", json=body).json()["content"]

        def embed_many():
            for _ in range(6):
                r = http.post("/v1/embeddings", json={"input": TEXTS})
                assert r.status_code == 200
                close(r.json()["data"][1]["embedding"], expected[1][1])

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            jobs = [pool.submit(embed_many), pool.submit(http.post, "/completion", json=body),
                    pool.submit(embed_many)]
            texts = [j.result() for j in jobs]
        assert texts[1].json()["content"] == alone


def test_a_sleeping_server_frees_the_embedding_context_and_a_request_wakes_it(server, expected, tmp_path):
    import time

    srv = ServerProcess(serve_args(server.dir, "-c", "512", "--sleep-idle-seconds", "1"), tmp_path / "serve.log")
    try:
        with srv.client() as http:
            first = http.post("/v1/embeddings", json={"input": TEXTS[0]}).json()["data"][0]["embedding"]
            deadline = time.monotonic() + 30
            while not http.get("/props").json()["is_sleeping"]:  # the context closed before the weights
                assert time.monotonic() < deadline, "the server did not go to sleep"
                time.sleep(0.1)
            again = http.post("/v1/embeddings", json={"input": TEXTS[0]})
            assert again.status_code == 200 and again.json()["data"][0]["embedding"] == first
            close(first, expected[1][0])
        assert "waking: a request needs the model" in srv.log()
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.log()
