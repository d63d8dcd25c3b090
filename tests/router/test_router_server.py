"""The router (`specserve serve --models-from ollama`, `--models-dir`) as clients meet it: a real router on
a free port over an Ollama-style store the test writes (manifests and sha256 blobs of tiny GGUFs), each
model in its own child process. Listing with status, routing by name on every API, the official
`ollama` client, switching, LRU eviction, broken models failing alone, unload mid-stream, crashes, and
no child left behind after the router stops or dies."""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ollama
import pytest
import tiny_models
from server_fixtures import API_KEY, ServerProcess, wait_for
from store_fixtures import fake_gguf, ollama_model

pytestmark = pytest.mark.server


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is `pid` (zombies excluded)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """An Ollama store: tiny-a:latest and tiny-b:1b (two tiny models), tiny-draft:1b (a smaller one that pairs
    with them), a manifest naming a missing blob, one whose blob is truncated, and a blob that starts as GGUF
    and is garbage after."""
    d = tmp_path_factory.mktemp("router_store")
    root = d / "ollama"
    a = tiny_models.write_tiny_model(d / "a.gguf", seed=1).read_bytes()
    b = tiny_models.write_tiny_model(d / "b.gguf", seed=2).read_bytes()
    small = tiny_models.write_tiny_model(d / "small.gguf", seed=3, n_layer=1, n_embd=32, n_head=2, n_head_kv=1,
                                         n_ff=64).read_bytes()  # the same vocabulary, a fifth of a pass: a draft
    ollama_model(root, "tiny-a", a)
    ollama_model(root, "tiny-b:1b", b)
    ollama_model(root, "tiny-draft:1b", small)
    ollama_model(root, "gone:1b", b + b"x", write_blob=False)
    ollama_model(root, "cut:1b", a[:1000], size=len(a))
    ollama_model(root, "garbage:1b", fake_gguf("not really a model" * 10))
    return root


def start(store: Path, tmp_path: Path, *extra: str, name: str = "router.log") -> ServerProcess:
    return ServerProcess(["--models-from", "ollama", "-t", "1", "-c", "512", "--drain-timeout", "2", *extra],
                         tmp_path / name, api_key=API_KEY, env={"OLLAMA_MODELS": str(store)})


@pytest.fixture(scope="module")
def router(store, tmp_path_factory):
    srv = start(store, tmp_path_factory.mktemp("router"), "--models-max", "2")
    yield srv
    srv.stop()


def serves(pid: int, name: str) -> bool:
    """Whether the child `pid` serves model `name` (its -a aliases; another child's command line may name it too,
    as a --draft-candidates entry)."""
    args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    return b"-a" in args and name.encode() in args[args.index(b"-a") + 1].split(b",")


def status(srv: ServerProcess, name: str) -> dict:
    data = srv.client().get("/models").json()["data"]
    return next(m for m in data if m["id"] == name)["status"]


def chat(srv: ServerProcess, model: str, **kw) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **kw}
    return srv.client().post("/v1/chat/completions", json=body)


def test_router_props(router):
    props = router.client().get("/props").json()  # no ?model=: the router's own, as llama-server's router
    assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is True
    root = router.client().get("/")  # Ollama's clients probe / for a 200
    assert root.status_code == 200 and "router is running" in root.text


def test_lists_every_model_with_status_and_why(router):
    data = router.client().get("/v1/models").json()["data"]
    assert {m["id"] for m in data} == {"tiny-a:latest", "tiny-b:1b", "tiny-draft:1b", "gone:1b", "cut:1b",
                                       "garbage:1b"}
    assert status(router, "gone:1b")["failed"] and "missing" in status(router, "gone:1b")["reason"]
    assert "the manifest says" in status(router, "cut:1b")["reason"]
    for m in data:
        assert m["owned_by"] == "specserve" and m["store"] == "ollama" and "path" not in m
    # Ollama's list: the models that can be served, by Ollama's names, with their blobs' digests
    listed = ollama.Client(host=router.url, headers=router.headers).list()
    assert {m.model for m in listed.models} == {"tiny-a:latest", "tiny-b:1b", "tiny-draft:1b", "garbage:1b"}
    blob = next(m for m in listed.models if m.model == "tiny-a:latest")
    assert blob.details.family == "llama" and len(blob.digest) == 64


def test_routes_by_name_and_switches(router):
    r = chat(router, "tiny-b:1b")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny-b:1b"
    assert status(router, "tiny-b:1b")["value"] == "loaded"
    r = router.client().post("/completion", json={"model": "tiny-a", "prompt": "a b", "n_predict": 3})
    assert r.status_code == 200, r.text  # llama-server's API, `:latest` implied
    ps = router.client().get("/api/ps").json()["models"]
    assert {m["name"] for m in ps} == {"tiny-a:latest", "tiny-b:1b"}
    r = router.client().post("/v1/messages", json={"model": "tiny-b:1b", "max_tokens": 3,
                                                     "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_ollama_client_chat_whole_and_streamed(router):
    client = ollama.Client(host=router.url, headers=router.headers, timeout=60)
    whole = client.chat(model="tiny-a", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 5})
    assert whole.done and whole.eval_count == 5
    parts = list(client.chat(model="tiny-a:latest", messages=[{"role": "user", "content": "hi"}],
                             options={"num_predict": 5}, stream=True))
    assert parts[-1].done and "".join(p.message.content for p in parts) == whole.message.content
    assert router.client().post("/models/load", json={"model": "tiny-b:1b"}).status_code == 200
    shown = client.show("tiny-b:1b")  # loaded: its child answers
    assert shown.details.family == "llama"
    client.chat(model="tiny-a", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    router.client().post("/models/unload", json={"model": "tiny-b:1b"})
    header = client.show("tiny-b:1b")  # unloaded: described from its GGUF header, not loaded for it
    assert status(router, "tiny-b:1b")["value"] == "unloaded"
    assert header.details == shown.details and header.capabilities == shown.capabilities
    assert header.template == shown.template and header.modelinfo["general.architecture"] == "llama"
    made = client.generate(model="tiny-b:1b", prompt="a b", options={"num_predict": 3})
    assert made.done and made.eval_count == 3
    assert {"tiny-a:latest", "tiny-b:1b"} <= {m.model for m in client.ps().models}
    props = router.client().get("/props", params={"model": "tiny-b:1b"})  # a GET routes by ?model=
    assert props.status_code == 200 and props.json()["model_alias"] == "tiny-b:1b"


@pytest.mark.parametrize("path, body, shape", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "openai"),
    ("/completion", {"prompt": "x"}, "openai"),
    ("/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}, "anthropic"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}, "ollama"),
    ("/api/generate", {"prompt": "x"}, "ollama"),
])
def test_unknown_model_404_in_each_apis_shape(router, path, body, shape):
    r = router.client().post(path, json={"model": "no-such-model", **body})
    assert r.status_code == 404
    err = r.json()
    message = {"openai": lambda: err["error"]["message"], "ollama": lambda: err["error"],
               "anthropic": lambda: err["error"]["message"]}[shape]()
    if shape == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == "not_found_error"
    assert "no-such-model" in message and "tiny-a:latest" in message  # names some that exist


def test_each_model_gets_a_draft_found_among_the_discovered(router):
    assert chat(router, "tiny-b:1b").status_code == 200
    entry = next(m for m in router.client().get("/models").json()["data"] if m["id"] == "tiny-b:1b")
    choice = entry["draft_choice"]
    assert entry["draft"] == "tiny-draft:1b" and choice["mode"] == "auto"  # named as the store names it
    assert "tiny-draft:1b" in choice["reason"] and "sha256-" in choice["file"]
    excluded = {c["name"]: c["reason"] for c in choice["excluded"]}
    assert "too costly" in excluded["tiny-a:latest"]  # as big as the target: no draft
    assert "gone:1b" not in excluded and "cut:1b" not in excluded  # found broken: never offered
    assert "not a GGUF file" in excluded["garbage:1b"]  # found fine, refused on a closer look
    r = chat(router, "tiny-b:1b", max_tokens=24, temperature=0)
    assert r.json()["usage"]["speculative"]["mode"] == "auto"


def test_ollama_client_unknown_model_raises_404(router):
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=router.url, headers=router.headers).chat(model="nope", messages=[])
    assert e.value.status_code == 404


@pytest.mark.parametrize("name", ["/etc/passwd", "../tiny-a", "~/x.gguf", "tiny-a.gguf"])
def test_path_like_names_refused(router, name):
    r = chat(router, name)
    assert r.status_code == 400 and "looks like a file path" in r.json()["error"]["message"]


def test_no_host_folder_in_what_clients_are_told(router, store):
    assert chat(router, "garbage:1b").status_code == 422
    assert chat(router, "tiny-a").status_code == 200  # loaded: its status shows its command line
    told = [chat(router, n).text for n in ("gone:1b", "cut:1b", "garbage:1b")] + [router.client().get("/models").text]
    assert "sha256-" in told[0] and "blobs" in told[0]  # the file is named...
    assert all(str(store.parent) not in t and "/tmp" not in t for t in told)  # ...never where it lies


def test_broken_models_fail_alone(router):
    for name in ("gone:1b", "cut:1b"):  # found broken: never started
        r = chat(router, name)
        assert r.status_code == 422 and "cannot be served" in r.json()["error"]["message"]
    r = chat(router, "garbage:1b")  # GGUF magic, garbage after: its child fails to load it
    assert r.status_code == 422, r.text
    assert "failed to load" in r.json()["error"]["message"]
    st = status(router, "garbage:1b")
    assert st["value"] == "unloaded" and st["failed"] and st["exit_code"] != 0 and st["reason"]
    assert chat(router, "garbage:1b").status_code == 422  # not retried on every request
    assert chat(router, "tiny-a").status_code == 200  # the others keep serving
    r = router.client().post("/api/generate", json={"model": "garbage:1b", "prompt": "x"})
    assert r.status_code == 422 and "failed to load" in r.json()["error"]


def test_crashed_child_shows_failed_and_reloads(router):
    assert chat(router, "tiny-a").status_code == 200
    assert chat(router, "tiny-b:1b").status_code == 200
    # the child of tiny-b: the one whose command line names it
    pid = next(p for p in children_of(router.proc.pid) if serves(p, "tiny-b:1b"))
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: status(router, "tiny-b:1b").get("failed"), 10)
    assert "crashed" in status(router, "tiny-b:1b")["reason"]
    assert chat(router, "tiny-a").status_code == 200  # the other kept serving
    assert chat(router, "tiny-b:1b").status_code == 200  # loaded again
    assert "failed" not in status(router, "tiny-b:1b")


def test_storm_of_loads_one_child_per_model(router):
    router.client().post("/models/unload", json={"model": "tiny-b:1b"})
    before = children_of(router.proc.pid)
    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda _: chat(router, "tiny-b:1b").status_code, range(12)))
    assert codes == [200] * 12  # every request waited for the one load
    started = children_of(router.proc.pid) - before
    assert len([p for p in started if serves(p, "tiny-b:1b")]) == 1


def test_load_unload_endpoints(router):
    c = router.client()
    assert c.post("/models/load", json={"model": "tiny-a"}).json() == {"success": True}
    assert status(router, "tiny-a:latest")["value"] == "loaded"
    assert c.post("/models/unload", json={"model": "tiny-a"}).json() == {"success": True}
    assert status(router, "tiny-a:latest") == {"value": "unloaded"}
    assert c.post("/models/unload", json={"model": "tiny-a"}).status_code == 400  # not loaded
    assert c.post("/models/load", json={"model": "nope"}).status_code == 404
    # Ollama's unload: keep_alive 0 and nothing to generate
    assert c.post("/models/load", json={"model": "tiny-a"}).status_code == 200
    r = c.post("/api/generate", json={"model": "tiny-a", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and status(router, "tiny-a:latest")["value"] == "unloaded"


def test_unload_mid_stream_ends_cleanly(router):
    body = {"model": "tiny-a", "prompt": "a", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    with router.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(x for x in lines if x.startswith("data: "))
        unloading = httpx.post(router.url + "/models/unload", json={"model": "tiny-a"}, headers=router.headers,
                               timeout=60)
        rest = [x for x in lines if x.startswith("data: ")]  # ends, without a broken connection
    assert unloading.status_code == 200
    last = rest[-1]
    assert last == "data: [DONE]" or "error" in json.loads(last.removeprefix("data: "))
    assert status(router, "tiny-a:latest")["value"] == "unloaded"


def test_lru_with_models_max_1_and_no_child_left(store, tmp_path):
    srv = start(store, tmp_path, "--models-max", "1")
    try:
        assert chat(srv, "tiny-a").status_code == 200
        assert chat(srv, "tiny-b:1b").status_code == 200
        assert status(srv, "tiny-a:latest")["value"] == "unloaded"
        assert status(srv, "tiny-b:1b")["value"] == "loaded"
        assert len(children_of(srv.proc.pid)) == 1
        assert chat(srv, "tiny-a").status_code == 200
        assert status(srv, "tiny-b:1b")["value"] == "unloaded"
        kids = children_of(srv.proc.pid)
        assert len(kids) == 1
        # a storm over two models with one place: each request served, or told to retry (429), none 5xx
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: chat(srv, ("tiny-a", "tiny-b:1b")[i % 2]).status_code, range(8)))
        assert set(codes) <= {200, 429} and 200 in codes
        kids = children_of(srv.proc.pid)
        assert len(kids) == 1
    finally:
        code = srv.stop()
    assert code == 0
    assert not any(alive(k) for k in kids)


def test_children_die_with_a_killed_router(store, tmp_path):
    srv = start(store, tmp_path)
    assert chat(srv, "tiny-a").status_code == 200
    kids = children_of(srv.proc.pid)
    assert len(kids) == 1
    srv.proc.kill()  # no chance to stop them: the kernel does (PR_SET_PDEATHSIG)
    srv.proc.wait()
    assert wait_for(lambda: not any(alive(k) for k in kids), 10)
    srv.stop()


def test_no_autoload(store, tmp_path):
    srv = start(store, tmp_path, "--no-models-autoload")
    try:
        r = chat(srv, "tiny-a")
        assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"]
        assert srv.client().post("/models/load", json={"model": "tiny-a"}).status_code == 200
        assert chat(srv, "tiny-a").status_code == 200
        kids = children_of(srv.proc.pid)
        srv.proc.send_signal(signal.SIGINT)  # Ctrl-C: the router stops its children, then itself
        assert srv.proc.wait(30) == 0
        assert kids and not any(alive(k) for k in kids)
    finally:
        srv.stop()


def test_models_dir_and_preset(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    tiny_models.write_tiny_model(models / "tiny.gguf", seed=1)
    draft = tiny_models.write_tiny_model(tmp_path / "draft.gguf", seed=1, noise=0.05, noise_seed=7)
    preset = tmp_path / "preset.ini"
    preset.write_text(f"version = 1\n[*]\nc = 256\n[tiny]\nmodel-draft = {draft}\nload-on-startup = true\n"
                      f"[extra]\nmodel = {models / 'tiny.gguf'}\nspec = ngram\n")
    srv = ServerProcess(["--models-dir", str(models), "--models-preset", str(preset), "-t", "1"],
                        tmp_path / "router.log")
    try:
        assert wait_for(lambda: status(srv, "tiny")["value"] == "loaded", 60)  # load-on-startup
        entry = next(m for m in srv.client().get("/models").json()["data"] if m["id"] == "tiny")
        assert entry["draft"] == "draft" and entry["draft_choice"]["mode"] == "given"  # named, not where it lies
        r = chat(srv, "tiny", max_tokens=8)
        assert r.status_code == 200 and r.json()["usage"]["speculative"]["mode"] == "auto"
        assert chat(srv, "extra").status_code == 200
        assert chat(srv, "extra").json()["usage"]["speculative"]["mode"] == "ngram"
        # GET /models?reload=1 discovers again: a new file is a new model, a removed one is unloaded and gone
        (models / "new.gguf").write_bytes((models / "tiny.gguf").read_bytes())
        assert "new" not in {m["id"] for m in srv.client().get("/models").json()["data"]}
        assert "new" in {m["id"] for m in srv.client().get("/models?reload=1").json()["data"]}
        assert status(srv, "extra")["value"] == "loaded"  # a new candidate draft does not unload it
        assert chat(srv, "new").status_code == 200
        kids = children_of(srv.proc.pid)
        (models / "new.gguf").unlink()
        assert "new" not in {m["id"] for m in srv.client().get("/models?reload=1").json()["data"]}
        assert len(children_of(srv.proc.pid)) == len(kids) - 1
        assert chat(srv, "tiny").status_code == 200  # the others untouched
    finally:
        srv.stop()


def test_memory_budget_unloads_first_or_refuses_with_numbers(store, tmp_path):
    # a tiny model's child: about 100 MiB of process and 64 MiB of cross-request store; 250 MiB holds one
    srv = start(store, tmp_path, "--models-memory", "250MiB")
    try:
        assert chat(srv, "tiny-a").status_code == 200
        entry = next(m for m in srv.client().get("/models").json()["data"] if m["id"] == "tiny-a:latest")
        assert entry["memory"]["bytes"] > 100 << 20 and "process" in entry["memory"]["estimate"]
        assert chat(srv, "tiny-b:1b").status_code == 200  # fits only once tiny-a is out
        assert status(srv, "tiny-a:latest")["value"] == "unloaded"
        assert len(children_of(srv.proc.pid)) == 1
    finally:
        srv.stop()
    srv = start(store, tmp_path, "--models-memory", "120MiB", name="small.log")
    try:
        r = srv.client().post("/api/chat", json={"model": "tiny-a", "messages": []})
        assert r.status_code == 422
        assert "more than the router's memory budget of 120.0 MiB" in r.json()["error"]
        assert "weights" in r.json()["error"] and not children_of(srv.proc.pid)
    finally:
        srv.stop()


def test_tags_details_as_the_loaded_model_gives_them(router):
    listed = {m["name"]: m for m in router.client().get("/api/tags").json()["models"]}
    router.client().post("/models/load", json={"model": "tiny-a"})
    running = {m["name"]: m for m in router.client().get("/api/ps").json()["models"]}
    shown = router.client().post("/api/show", json={"model": "tiny-a"}).json()  # loaded: its child's answer
    assert listed["tiny-a:latest"]["details"] == running["tiny-a:latest"]["details"] == shown["details"]
    assert shown["details"]["quantization_level"] == "F32"


def test_client_leaving_while_queued_costs_no_model_its_place(store, tmp_path):
    srv = start(store, tmp_path, "--models-max", "1")
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(chat, srv, "tiny-a")  # tiny-a loading: its place is taken
            assert wait_for(lambda: status(srv, "tiny-a:latest")["value"] == "loading", 10)
            with pytest.raises(httpx.ReadTimeout):  # tiny-b waits for a place, and its client gives up
                httpx.post(srv.url + "/v1/chat/completions", headers=srv.headers, timeout=0.5, json={
                    "model": "tiny-b:1b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
            assert first.result().status_code == 200
        time.sleep(1.5)  # had tiny-b's request still been waiting, tiny-a, now idle, would have gone for it
        assert status(srv, "tiny-a:latest")["value"] == "loaded"
        assert status(srv, "tiny-b:1b")["value"] == "unloaded"
    finally:
        srv.stop()
