"""The pairing check: flagrant mismatches refuse with the evidence, subtle ones warn."""
from __future__ import annotations

import subprocess
import sys

import pytest

from specserve.backends import load_model
from specserve.pairing import check_pairing
from tiny_models import TokenType, write_tiny_model


@pytest.fixture(scope="module")
def target(tiny_models):
    return tiny_models["target"]


def pair_with(target, tmp_path, **edit):
    draft = load_model(str(write_tiny_model(tmp_path / "draft.gguf", seed=1, **edit)), n_threads=1)
    try:
        return check_pairing(target, draft)
    finally:
        draft.close()


def test_same_family_is_compatible(target, tiny_models):
    report = check_pairing(target, tiny_models["draft_close"])
    assert report.compatible and not report.warnings


def test_swapped_token_texts_refuse_naming_the_ids(target, tmp_path):
    report = pair_with(target, tmp_path, swap_tokens=(100, 101))
    assert report.flagrant
    text = " ".join(report.problems)
    assert "id 100" in text and "2 id(s)" in text


def test_different_vocab_size_refuses(target, tmp_path):
    report = pair_with(target, tmp_path, extra_tokens=300)
    assert report.flagrant and "vocabulary sizes differ" in report.problems[0]
    assert "308" in report.problems[0] and "608" in report.problems[0]


def test_padding_within_128_only_warns(target, tmp_path):
    report = pair_with(target, tmp_path, extra_tokens=64)
    assert report.compatible and any("within padding" in w for w in report.warnings)


def test_different_tokenizer_model_refuses(target, tmp_path):
    report = pair_with(target, tmp_path, tokenizer_model="llama")
    assert report.flagrant and any("tokenizer models differ: target bpe, draft spm" in p for p in report.problems)


def test_different_eos_refuses(target, tmp_path):
    report = pair_with(target, tmp_path, eos_id=307)
    assert report.flagrant and any(p.startswith("EOS differs") for p in report.problems)


@pytest.mark.parametrize(
    "edit, evidence",
    [
        (dict(drop_merge="Ġth e"), "BPE merges differ"),
        (dict(drop_merge="Ġth e"), "tokenizes differently"),
        (dict(token_types={"<|im_start|>": TokenType.USER_DEFINED}), "special-token flags differ"),
        (dict(chat_template="{{ messages[0]['content'] }}"), "chat template differs"),
        (dict(pre_tokenizer="default"), "pre-tokenizer differs"),
    ],
)
def test_subtle_mismatch_starts_but_warns(target, tmp_path, edit, evidence):
    report = pair_with(target, tmp_path, **edit)
    assert report.compatible, report.problems
    assert any(evidence in w for w in report.warnings), report.warnings


def test_cli_refuses_smollm2_with_gemma(real_model_paths):
    r = subprocess.run(
        [sys.executable, "-m", "specserve", "generate", "-m", str(real_model_paths["smollm2-f16"]),
         "-md", str(real_model_paths["gemma"]), "-p", "hi", "-n", "4"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2
    assert "draft model refused" in r.stderr and "tokenizer models differ" in r.stderr
    assert "vocabulary sizes differ" in r.stderr and "49152" in r.stderr and "262144" in r.stderr
    assert "Traceback" not in r.stderr



def run_time_warnings(tiny_models, draft: str, caplog) -> list[str]:
    """Greedy draft-model generation over a few prompts; the pairing warnings it logged."""
    from specserve.config import SamplingParams, SpecParams
    from specserve.engine import Engine

    slot = Engine(tiny_models["target"], tiny_models[draft], n_ctx=512).new_slot()
    with caplog.at_level("WARNING", logger="specserve"):
        for text in ("the cat sat", "hello world", "once upon a time"):
            slot.generate(text, SamplingParams(max_tokens=120, ignore_eos=True), SpecParams(mode="draft", draft_max=4))
    slot.close()
    return [r.getMessage() for r in caplog.records if "may not match the target" in r.getMessage()]


def test_run_time_warning_when_greedy_acceptance_stays_low(tiny_models, caplog):
    """A draft that passes the vocabulary check but rarely agrees gets a warning at run time."""
    warnings = run_time_warnings(tiny_models, "draft_far", caplog)
    assert len(warnings) == 1 and "specserve check" in warnings[0]


def test_no_run_time_warning_for_a_same_family_draft(tiny_models, caplog):
    assert not run_time_warnings(tiny_models, "draft_close", caplog)


@pytest.mark.real_models
def test_qwen_reference_pair_compatible_and_says_where_the_templates_differ():
    from specserve import models
    from specserve.backends import load_model

    target = load_model(str(models.ensure("qwen2.5-coder-1.5b-f16")), n_threads=1)
    draft = load_model(str(models.ensure("qwen2.5-coder-0.5b")), n_threads=1)
    try:
        report = check_pairing(target, draft)
    finally:
        target.close()
        draft.close()
    assert report.compatible, report.problems
    # the 0.5B's template escapes one JSON example differently ({{ vs {): a warning that shows where
    (template,) = [w for w in report.warnings if w.startswith("chat template differs")]
    assert "line 13" in template and "<function-nam" in template
    assert not [w for w in report.warnings if "merges" in w or "probe text" in w]
