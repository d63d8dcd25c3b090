"""/tokenize's large answers are encoded a slice at a time (server/apis/templates.py): json.dumps holds the
interpreter lock until it returns, so one call over 600k pieces stopped the event loop from a worker thread
(issue 63's storm: /health waited 0.7-1.7 s; 0.08-0.3 s since, SmolLM2 on a shared 2-core machine)."""
from __future__ import annotations

import json

import pytest

from specserve.server.apis.llama import templates

SLICE = templates.JSON_SLICE


@pytest.mark.parametrize("n", [0, 1, SLICE, SLICE + 1, 3 * SLICE + 7])
def test_an_answer_encoded_in_slices_is_the_bytes_of_one_call(n):
    pieces = [{"id": i, "piece": ["é", '"', "\n", "<s>"][i % 4]} for i in range(n)]
    assert templates._json_list("tokens", pieces) == templates._json({"tokens": pieces})
    assert json.loads(templates._json_list("tokens", list(range(n)))) == {"tokens": list(range(n))}


def test_no_encoding_call_covers_more_than_a_slice(monkeypatch):
    sizes = []
    dumps = json.dumps

    def counted(obj, **kw):
        sizes.append(len(obj) if isinstance(obj, list) else 0)
        return dumps(obj, **kw)

    monkeypatch.setattr(templates.json, "dumps", counted)
    templates._json_list("tokens", [{"id": i, "piece": "a"} for i in range(100_000)])
    assert sizes and max(sizes) <= SLICE
