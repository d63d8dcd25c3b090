"""`specserve export vllm`: specserve's settings as vLLM's --speculative-config."""
from __future__ import annotations

import json

import pytest

from specserve.cli import main
from specserve.cli.export import vllm_config


@pytest.mark.parametrize("kw, expected", [
    (dict(spec="draft", draft_model="qwen2.5-coder-0.5b", draft_max=4),
     {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 4}),
    (dict(spec="draft", draft_model="/models/Qwen2.5-Coder-0.5B-Instruct.gguf"),
     {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 8}),
    (dict(spec="ngram", draft_max=16, ngram_min=2, ngram_max=5),
     {"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_max": 5, "prompt_lookup_min": 2}),
    (dict(spec="suffix", cross_request=False),
     {"method": "suffix", "num_speculative_tokens": 32, "suffix_decoding_max_tree_depth": 24,
      "suffix_decoding_max_cached_requests": 0}),
    (dict(spec="auto"),  # one method per vLLM server: prompt lookup, with a note
     {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
    (dict(spec="none"), None),
])
def test_vllm_config_table(kw, expected):
    out = vllm_config(**kw)
    assert out.config == expected
    assert out.notes  # what does not carry over is always said


def test_unknown_gguf_draft_is_flagged():
    out = vllm_config("draft", "/tmp/my-draft.gguf")
    assert out.config["model"] == "my-draft"
    assert any("Hugging Face checkpoint" in n for n in out.notes)
    assert vllm_config("draft", "/tmp/my-draft.gguf", hf_draft="me/draft").config["model"] == "me/draft"


def test_from_bench_report(tmp_path, capsys):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"recommendation": {"spec": "draft", "draft_max": 2,
                                                     "draft_model": "/c/Qwen2.5-Coder-0.5B-Instruct.gguf"},
                                  "settings": {"target": "qwen2.5-coder-1.5b-f16"}}))
    assert main(["export", "vllm", "--from-bench", str(report)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                   "num_speculative_tokens": 2}
    assert "note:" in out.err
    assert main(["export", "vllm", "--from-bench", str(report), "--spec", "ngram", "--command"]) == 0
    assert capsys.readouterr().out.startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct --speculative-config '{")
    (tmp_path / "bad.json").write_text("{}")
    assert main(["export", "vllm", "--from-bench", str(tmp_path / "bad.json")]) == 2
