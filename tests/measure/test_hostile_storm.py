"""The storm of tools/hostile.py: what it counts as valid SSE per API, and one short storm against a real
`specserve serve` (tiny models, two tenants, Vertex mode for /predict) with every issue-63 bomb sent."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: F401
from specserve.measure.storm import sse_valid

OPENAI_OK = 'data: {"choices": []}\n\ndata: {"choices": [], "usage": {}}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize("text, path, valid", [
    (OPENAI_OK, "/v1/chat/completions", True),
    (OPENAI_OK.removesuffix("data: [DONE]\n\n"), "/v1/chat/completions", False),  # cut before its end
    ('data: {"choices": []}\n\ndata: {"error": {"code": "x"}}\n\ndata: [DONE]\n\n', "/v1/completions", False),
    ('data: {"choices": [\n\ndata: [DONE]\n\n', "/v1/completions", False),  # not JSON
    ('data: {"content": "a", "stop": false}\n\ndata: {"content": "", "stop": true}\n\n', "/completion", True),
    ('data: {"content": "a", "stop": false}\n\n', "/completion", False),
    ('event: message_start\ndata: {"type": "message_start"}\n\nevent: message_stop\ndata: {"type": "message_stop"}'
     '\n\n', "/v1/messages", True),
    ('event: message_start\ndata: {"type": "message_start"}\n\nevent: error\ndata: {"type": "error"}\n\n',
     "/v1/messages", False),
    ('event: response.created\ndata: {"type": "response.created"}\n\nevent: response.incomplete\n'
     'data: {"type": "response.incomplete"}\n\n', "/v1/responses", True),
    ("", "/completion", False),
])
def test_a_stream_is_valid_when_every_event_is_json_and_it_reaches_its_apis_end(text, path, valid):
    assert sse_valid(text, path) is valid


@pytest.mark.server
def test_a_short_storm_sends_every_bomb_and_counts_no_5xx(tiny_models_dir, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("key-a scope=tA\nkey-b scope=tB\nadmin\n")
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "2048", "--parallel", "2", "--api-key-file", str(keys)),
                        tmp_path / "serve.log", env={"AIP_MODE": "PREDICTION"})
    try:
        out = tmp_path / "storm.json"
        r = subprocess.run([sys.executable, "-m", "specserve.measure.hostile", "--url", srv.url, "--key", "admin",
                            "--tenant-keys", "key-a", "key-b", "--skip-bombs", "--storm", "3", "--clients", "2",
                            "--bomb-share", "0.5", "--pid", str(srv.proc.pid), "--json", str(out)],
                           capture_output=True, text=True, timeout=300)
        report = json.loads(out.read_text())
        assert r.returncode == 0 and report["5xx"] == 0 and report["invalid_sse"] == 0, (r.stdout, r.stderr)
        assert report["requests"] > 0 and report["health_polls"] > 0 and report["rss_end_mib"] > 0
        warm = report["warmup_bombs"]  # each bomb once before the clock: (status, note)
        assert len(warm) == 14 and not any(isinstance(s, int) and s >= 500 for s, _ in warm.values()), warm
        assert warm["logit_bias_120k_text_keys"] == [400, "logit_bias_too_large"]
        assert warm["responses_40k_one_word_items"] == [400, "context_length_exceeded"]
        assert warm["slots_read_by_another_tenant"] == [200, "no secret"]
        assert warm["slots_erase_by_another_tenant"] == [403, "slot_of_another_scope"]
        assert warm["predict_128_dropped_after_1s"][0] == "dropped"
    finally:
        assert srv.stop() == 0
