"""Tenants on one real server: what a profile pins and a key confines.

A request cannot leave its profile's cross-request scope, and a key confined to a scope keeps its requests in it
whatever they ask for (neither reads another tenant's earlier documents); a bad key file stops the server before it
loads; a profile's pinned= fields are refused when a request sets them otherwise. The servers: tenants (keys from a
file, a profile with a scope) and limited (a profile `fixed` that pins two fields); see defended_servers.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import serve_args, tiny_models_dir  # noqa: E402,F401

from defended_servers import (ADMIN, KEY_A, KEY_B, C, L, client, expect_error, limited_server,  # noqa: E402
                              tenants_server)

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    with tenants_server(tiny_models_dir, tmp_path_factory.mktemp("tenants")) as srv:
        yield srv


@pytest.fixture(scope="module")
def limited(tiny_models_dir, tmp_path_factory):
    with limited_server(tiny_models_dir, tmp_path_factory.mktemp("limited") / "serve.log") as srv:
        yield srv


def _suffix_run(srv, key: str, prompt: str, **spec) -> httpx.Response:
    with client(srv, key) as c:
        return c.post(C, json={"prompt": prompt, "max_tokens": 40, "ignore_eos": True, "model": spec.pop("model", None),
                               "speculative": {"mode": "suffix", **spec}})


def test_a_request_cannot_leave_its_profiles_scope(server):
    """The issue's reproduction: scope sA's documents, read through profile tenantA (scope tA)."""
    prompt = "the dog ran to the mat and the cat ran in the park"
    assert _suffix_run(server, ADMIN, prompt, cross_request_scope="sA").status_code == 200  # sA holds it now
    r = _suffix_run(server, ADMIN, prompt, model="tenantA", cross_request_scope="sA")
    err = expect_error(r, 400, "speculative.cross_request_scope", "pinned_parameter")
    assert "tenantA" in err["message"]
    own = _suffix_run(server, ADMIN, prompt, model="tenantA", cross_request_scope="tA")  # its own value: fine
    assert own.status_code == 200, own.text
    alone = _suffix_run(server, ADMIN, prompt, cross_request=False).json()["usage"]["speculative"]
    assert own.json()["usage"]["speculative"]["passes"] == alone["passes"]  # read nothing of sA's


def test_keys_confine_their_requests_to_their_scopes(server):
    """Tenant B's documents help B's retries and none of tenant A's requests, whatever A asks for."""
    ways = ({}, {"model": "tenantA"}, {"model": "tiny", "cross_request_scope": "tA"})
    for i, spec in enumerate(ways):
        prompt = f"a cat and a dog sat on the mat in the park {i}"
        first = _suffix_run(server, KEY_B, prompt).json()["usage"]["speculative"]
        retry = _suffix_run(server, KEY_B, prompt).json()["usage"]["speculative"]
        assert retry["passes"] <= 3 < first["passes"]  # B reads its own scope
        a = _suffix_run(server, KEY_A, prompt, **spec)
        assert a.status_code == 200, a.text
        # Had A read B's document it would take B's retry's 3 passes or fewer; A's own earlier documents
        # (its other prompts) may save it one or two.
        assert a.json()["usage"]["speculative"]["passes"] >= first["passes"] - 3, spec
    r = _suffix_run(server, KEY_A, "the cat", cross_request_scope="tB")
    expect_error(r, 400, "speculative.cross_request_scope", "pinned_parameter")
    with client(server, KEY_A) as c:
        r = c.post(L, json={"prompt": "the cat", "n_predict": 4, "speculative": {"cross_request_scope": "tB"}})
    expect_error(r, 400, "speculative.cross_request_scope", "pinned_parameter")


@pytest.mark.parametrize("line", ["k scope", "k scope=", "k tenant=a", "k scope=a\nk scope=b"])
def test_a_bad_key_file_exits_2_before_loading(tiny_models_dir, tmp_path, line):
    keys = tmp_path / "keys"
    keys.write_text(line + "\n")
    r = subprocess.run([sys.executable, "-m", "specserve", "serve", *serve_args(tiny_models_dir),
                        "--api-key-file", str(keys)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--api-key-file" in r.stderr and "k " not in r.stderr.split("line")[-1], r.stderr


def test_a_profile_pins_what_pinned_lists(limited):
    with httpx.Client(base_url=limited.url, timeout=60) as c:
        def post(**fields):
            return c.post(C, json={"model": "fixed", "prompt": "hi", "max_tokens": 2, **fields})

        expect_error(post(temperature=0.9), 400, "temperature", "pinned_parameter")
        expect_error(post(speculative={"verify": "rejection"}), 400, "speculative.verify", "pinned_parameter")
        assert post(temperature=0.5).status_code == 200
        assert post(top_p=0.9, seed=1).status_code == 200  # not pinned
        assert c.post(C, json={"prompt": "hi", "max_tokens": 2, "temperature": 0.9}).status_code == 200
        models = {m["id"]: m["specserve"] for m in c.get("/v1/models").json()["data"]}
        assert models["fixed"]["pinned"] == ["temperature", "verify"]


def test_slots_show_a_scoped_key_no_other_tenants_request(server):
    """Issue 63 N1: key B saw key A's grammar and stop strings in GET /slots, and could erase A's slot."""
    secret = {"prompt": "the cat", "n_predict": 4, "id_slot": 0, "grammar": 'root ::= "SECRET-GRAMMAR"',
              "stop": ["STOP-SECRET-XYZ"]}
    with client(server, KEY_A) as a, client(server, KEY_B) as b, client(server, ADMIN) as admin:
        assert a.post(L, json=secret).status_code == 200
        seen_by_b = b.get("/slots")
        assert seen_by_b.status_code == 200
        assert "SECRET" not in seen_by_b.text and "params" not in seen_by_b.json()[0]
        assert "speculation" not in seen_by_b.json()[0]  # summed over every tenant's requests
        assert "STOP-SECRET-XYZ" in a.get("/slots").text and "SECRET-GRAMMAR" in admin.get("/slots").text
        r = b.post("/slots/0?action=erase")
        assert r.status_code == 403 and r.json()["error"]["code"] == "slot_of_another_scope", r.text
        assert a.post("/slots/0?action=erase").status_code == 200  # its own scope's slot
