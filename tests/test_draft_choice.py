"""`-md auto`: which candidates pair with a target, ranked cheapest first, and why the others are out."""
from __future__ import annotations

import pytest

from specserve import learned
from specserve.auto.cost import Costs
from specserve.draft_choice import candidate_paths, choose_draft, decode_bytes
from tiny_models import write_tiny_model

# The target has 4 layers of width 128; drafts are narrower or shallower so that a pass is cheap.
TARGET = dict(seed=1, n_layer=4, n_embd=128, n_ff=256)
SMALL = dict(seed=3, n_layer=1, n_embd=64, n_ff=128)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafts")
    write_tiny_model(d / "target.gguf", **TARGET)
    write_tiny_model(d / "small.gguf", **SMALL)
    write_tiny_model(d / "medium.gguf", seed=4, n_layer=2, n_embd=64, n_ff=128)
    write_tiny_model(d / "costly.gguf", seed=5, n_layer=3, n_embd=128, n_ff=256)
    write_tiny_model(d / "larger.gguf", seed=6, n_layer=6, n_embd=128, n_ff=256)
    write_tiny_model(d / "spm.gguf", **SMALL, tokenizer_model="llama")
    write_tiny_model(d / "more_tokens.gguf", **SMALL, extra_tokens=300)
    write_tiny_model(d / "swapped.gguf", **SMALL, swap_tokens=(100, 101))
    write_tiny_model(d / "merge_dropped.gguf", seed=7, n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64,
                     drop_merge="Ġth e")
    (d / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    return d


def choose(folder, *names, **kw):
    return choose_draft(str(folder / "target.gguf"), [str(folder / f"{n}.gguf") for n in names], **kw)


def test_pairable_drafts_ranked_cheapest_first_with_their_cost(folder):
    choice = choose(folder, "medium", "small")
    assert [c.name for c in choice.ranked] == ["small", "medium"]
    small, medium = choice.ranked
    assert choice.chosen is small and choice.draft_path == str(folder / "small.gguf")
    assert 0 < small.cost < medium.cost < 0.5 and small.cost_source == "estimated"
    assert small.cost == pytest.approx(decode_bytes(folder / "small.gguf")[0] / decode_bytes(folder / "target.gguf")[0])
    assert small.memory > 0 and "+" in small.reason and f"{small.cost:.2f} of the target's" in small.reason
    assert choice.reason.startswith("small: the cheapest of 2 pairable candidate(s)")


@pytest.mark.parametrize("name, why", [
    ("spm", "vocabulary mismatch: tokenizer model llama, the target's gpt2"),
    ("more_tokens", "vocabulary mismatch: 608 tokens, the target's 308"),
    ("swapped", "vocabulary mismatch: token texts differ at 2 id(s), first at id 100"),  # pairing.py's, loaded
    ("larger", "larger than the target"),
    ("costly", "too costly: a pass costs 0.7"),
    ("broken", "not a GGUF file llama.cpp can read"),
])
def test_excluded_with_the_reason(folder, name, why):
    choice = choose(folder, name, "small")
    assert choice.chosen.name == "small"
    (out,) = choice.excluded
    assert out.name == name and out.excluded.startswith(why), out.excluded
    assert out.reason == f"{name}: excluded, {out.excluded}"


def test_subtle_mismatch_is_flagged_and_ranked_after_a_clean_one(folder):
    choice = choose(folder, "merge_dropped", "medium")
    flagged = next(c for c in choice.ranked if c.name == "merge_dropped")
    medium = next(c for c in choice.ranked if c.name == "medium")
    assert flagged.cost < medium.cost  # cheaper, yet ranked second: its drafts would be rarely accepted
    assert [c.name for c in choice.ranked] == ["medium", "merge_dropped"]
    assert flagged.flagged and "flagged: BPE merges differ" in flagged.reason


def test_no_pairable_candidate_runs_without_a_draft_and_says_why(folder):
    choice = choose(folder, "spm", "larger")
    assert choice.chosen is None and choice.draft_path is None and not choice.ranked
    assert choice.reason.startswith("none: no candidate pairs with the target; running without a draft model")
    assert choose(folder).reason.startswith("none: no candidate models were found")


def test_memory_counted_against_a_budget(folder):
    choice = choose(folder, "small", budget=1000, target_memory=500)
    assert choice.chosen is None
    assert choice.excluded[0].excluded.startswith("does not fit: the target 500 B + this draft")


def test_a_measured_cost_overrides_the_estimate(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_AUTO_PROFILE", "1")
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "models"))
    target, small = str(folder / "target.gguf"), str(folder / "small.gguf")
    costs = Costs()
    for n in (2, 4, 8) * 20:
        costs.verify.add(1, 0.010)
        costs.learn_draft_cost("draft", n, 1, n * 0.003)  # 3 ms a drafted token: 0.3 of a 10 ms pass
    learned.ProfileStore.for_models(target, small, 1).save(costs.state(), 1)
    choice = choose(folder, "small", n_threads=1)
    assert choice.chosen.cost_source == "measured" and choice.chosen.cost == pytest.approx(0.3, rel=0.15)
    assert "timed by --spec auto on this machine" in choice.chosen.reason


def test_a_pinned_draft_comes_first(folder):
    choice = choose(folder, "small", "medium", pinned=str(folder / "medium.gguf"))
    assert choice.chosen.name == "medium" and choice.chosen.pinned
    assert "pinned by `specserve bench --drafts auto`" in choice.reason


def test_candidate_paths_from_folders_without_the_target(folder, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    write_tiny_model(other / "big-00001-of-00002.gguf", seed=1)
    (other / "big-00002-of-00002.gguf").write_bytes(b"not the first part")
    (other / "notes.txt").write_text("not a model")
    paths = candidate_paths(folder / "target.gguf", [other, folder], packaged=False)
    names = [p.rsplit("/", 1)[1] for p in paths]
    assert "target.gguf" not in names and "small.gguf" in names and len(names) == len(set(names))
    assert "big-00001-of-00002.gguf" in names and "big-00002-of-00002.gguf" not in names


def test_bench_md_auto_names_the_chosen_draft(folder, tmp_path, monkeypatch):
    import argparse

    from specserve.cli.bench import _auto_drafts

    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path))  # no packaged model is a candidate
    args = argparse.Namespace(ctx_size=512, threads=1, draft_ctx=[256], ubatch_size_draft=16, n_gpu_layers=0,
                              draft_candidates=[])
    target = str(folder / "target.gguf")
    assert _auto_drafts(args, target, ["auto"]) == [str(folder / "small.gguf")]
    assert _auto_drafts(args, target, ["none", "x.gguf"]) == ["x.gguf"]


def test_candidates_given_as_files_named_as_a_store_names_them(folder, tmp_path, monkeypatch):
    import argparse

    from specserve.cli.common import auto_draft

    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "home"))
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    write_tiny_model(blobs / "target-blob", **TARGET)
    write_tiny_model(blobs / "sha256-0123", **SMALL)  # an Ollama blob: no .gguf name, not globbed
    args = argparse.Namespace(ctx_size=512, threads=1, draft_ctx=256, ubatch_size_draft=16, n_gpu_layers=0,
                              draft_candidates=[])
    assert auto_draft(args, str(blobs / "target-blob")).chosen is None
    args.draft_candidates = [f"tiny-draft:latest={blobs / 'sha256-0123'}", str(folder / "medium.gguf")]
    choice = auto_draft(args, str(blobs / "target-blob"))
    assert [c.name for c in choice.ranked] == ["tiny-draft:latest", "medium"]
    assert choice.draft_path == str(blobs / "sha256-0123")
