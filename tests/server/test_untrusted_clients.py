"""What a request from an untrusted client cannot do to the real server: forge log lines, reach it from a foreign
page (DNS rebinding, a form POST, a foreign origin), read the API key off the command line, or learn the model
files' paths.

One server (defended_servers.guarded_server): its API key from the environment, CORS for one origin.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import tiny_models_dir  # noqa: E402,F401

from defended_servers import C, KEY, WEB, http, server  # noqa: E402,F401

pytestmark = pytest.mark.server


# --- client strings cannot forge log lines ------------------------------------------------------------------

def test_client_strings_cannot_forge_log_lines(server, http):
    forged = "ERROR specserve.server: forged"
    # any model name is served (by the served model's profile, whose name is what the request line logs)
    by_model = http.post(C, json={"model": f"x\n{forged} by a model name", "prompt": "hi", "max_tokens": 1})
    assert by_model.status_code == 200
    assert http.post(C, json={"prompt": "hi", "speculative": {f"k\r\n{forged} by a key": 1}}).status_code == 400
    assert http.post(C, json={"prompt": "hi", "speculative": {"mode": f"\u2028{forged} by a mode"}}).status_code == 400
    time.sleep(0.3)
    lines = server.log().splitlines()
    assert not [ln for ln in lines if ln.startswith(forged)]
    assert sum("forged by a" in ln for ln in lines) == 2  # logged, escaped, on the request's own line


# --- browser-origin attacks ---------------------------------------------------------------------------------

def test_a_rebinding_page_is_refused(server):
    """A text/plain POST from a foreign page, to a name that resolves to 127.0.0.1."""
    r = httpx.post(server.url + C, content=b'{"prompt": "hi", "max_tokens": 2}',
                   headers={"Content-Type": "text/plain", "Origin": "http://attacker.example",
                            "Host": "attacker.example", "X-Api-Key": KEY})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}"):
        assert httpx.get(server.url + "/health", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_post_bodies_must_be_json(http, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    r = http.post(C, content=b'{"prompt": "hi", "max_tokens": 2}', headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_foreign_origins_are_refused_and_the_allowed_one_gets_cors(server, http):
    evil = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    same = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": server.url})
    assert same.status_code == 200
    preflight = httpx.options(server.url + C, headers={"Origin": WEB, "Access-Control-Request-Method": "POST",
                                                       "Access-Control-Request-Headers": "content-type,x-api-key"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == WEB
    allowed = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": WEB})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == WEB


# --- the API key off the command line; names, not paths -----------------------------------------------------

def test_the_key_comes_from_the_environment_and_either_header(server):
    assert KEY.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_models_names_files_not_paths(http):
    info = http.get("/v1/models").json()["data"][0]["specserve"]
    assert (info["target"], info["draft"]) == ("tiny.gguf", "tiny_draft.gguf")
