"""What --spec auto learnt, kept across processes: the file, its key, and planning from it."""
from __future__ import annotations

import json

import pytest

from specserve import learned
from specserve.config import SpecParams
from specserve.controller import Controller
from test_controller import SCENARIOS, simulate


@pytest.fixture
def model_files(tmp_path):
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    target.write_bytes(b"GGUF target" * 100)
    draft.write_bytes(b"GGUF draft" * 100)
    return str(target), str(draft)


def store(model_files, tmp_path, threads=2) -> learned.ProfileStore:
    return learned.ProfileStore.for_models(*model_files, threads, directory=tmp_path / "auto")


def trained(scenario: str, st=None) -> Controller:
    s = SCENARIOS[scenario]
    ctl = Controller(st)
    simulate(s, lambda: ctl.policy(SpecParams(draft_max=s.cap), s.names), seed=3)
    return ctl


def test_round_trip_keeps_costs_and_acceptance(model_files, tmp_path):
    st = store(model_files, tmp_path)
    ctl = trained("cpu_f16_high", st)
    ctl.save()
    data = json.loads(st.path.read_text())
    assert (data["format"], data["version"]) == (learned.FORMAT, learned.VERSION)
    assert data["inputs"]["target"]["name"] == "target.gguf" and data["inputs"]["n_threads"] == 2
    fresh = Controller(store(model_files, tmp_path))
    assert fresh.load()
    ctl.verify._table = None  # a table cached some passes ago may lag its estimates by up to 2%
    V, W = ctl.verify.table(9), fresh.verify.table(9)
    assert W == pytest.approx(V, rel=1e-9)  # the same measured pass costs
    for key, counts in ctl.pooled.items():  # the same acceptance rates, with half the evidence
        got = fresh.pooled[key]
        assert got[0] / got[1] == pytest.approx(counts[0] / counts[1])
        assert got[1] == pytest.approx(0.5 * counts[1])
    # the drafting cost per token; (the ridge prior weighs a little more against half the evidence)
    assert fresh.draft_coef("draft", W)[1] == pytest.approx(ctl.draft_coef("draft", V)[1], rel=0.05)


def test_a_fresh_process_plans_its_first_request_like_the_trained_one(model_files, tmp_path):
    """The point of keeping it: the first request of a new process is not planned from priors."""
    s = SCENARIOS["cpu_q41_high"]  # the draft cannot pay here: priors say it can
    st = store(model_files, tmp_path)
    trained("cpu_q41_high", st).save()
    spec = SpecParams(draft_max=s.cap)

    def first_request(ctl):
        s1 = type(s)(**{**s.__dict__, "n_requests": 1})
        return simulate(s1, lambda: ctl.policy(spec, s.names), seed=11)

    cold = first_request(Controller())
    warm_ctl = Controller(store(model_files, tmp_path))
    assert warm_ctl.load()
    warm = first_request(warm_ctl)
    draft_steps = lambda run: sum(1 for _, d, _ in run.steps if d == "draft")  # noqa: E731
    assert draft_steps(warm) < draft_steps(cold)
    assert warm.tokens_per_s > cold.tokens_per_s


@pytest.mark.parametrize("change", ["threads", "target", "version", "garbage"])
def test_foreign_or_stale_profiles_are_ignored(model_files, tmp_path, change, caplog):
    st = store(model_files, tmp_path)
    trained("cpu_f16_high", st).save()
    if change == "threads":
        other = store(model_files, tmp_path, threads=1)
        other.path = st.path  # even at the same path, the inputs inside must match
    elif change == "target":
        with open(model_files[0], "ab") as f:
            f.write(b"replaced in place")
        other = store(model_files, tmp_path)
        other.path = st.path
    elif change == "version":
        data = json.loads(st.path.read_text())
        data["version"] = learned.VERSION + 1
        st.path.write_text(json.dumps(data))
        other = store(model_files, tmp_path)
    else:
        st.path.write_text("{not json")
        other = store(model_files, tmp_path)
    ctl = Controller(other)
    assert not ctl.load()
    assert ctl.verify.table(4) is None  # nothing learnt: plans from priors


def test_malformed_state_falls_back_to_priors(model_files, tmp_path):
    st = store(model_files, tmp_path)
    trained("cpu_f16_high", st).save()
    data = json.loads(st.path.read_text())
    data["state"]["pooled"][0] = ["draft", 0, 0.0, 1.0]  # too few counts
    st.path.write_text(json.dumps(data))
    ctl = Controller(store(model_files, tmp_path))
    assert not ctl.load()
    assert ctl.pooled == {} and ctl.verify.table(4) is None


def test_saved_every_few_requests_and_nothing_when_off(model_files, tmp_path, monkeypatch):
    st = store(model_files, tmp_path)
    ctl = Controller(st)
    for _ in range(learned.SAVE_EVERY - 1):
        ctl.policy(SpecParams(), ["ngram"])
    assert not st.path.exists()
    ctl.policy(SpecParams(), ["ngram"])
    assert st.path.exists()
    monkeypatch.setenv("SPECSERVE_AUTO_PROFILE", "0")
    assert not learned.enabled()


def test_engine_load_uses_the_profile(tiny_paths, tmp_path, monkeypatch):
    """Engine.load reads the profile for its models and writes it at close."""
    from specserve.config import ModelConfig, SamplingParams
    from specserve.engine import Engine

    monkeypatch.setenv("SPECSERVE_AUTO_PROFILE", "1")
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "models"))
    cfg = ModelConfig(str(tiny_paths["target"]), str(tiny_paths["draft_close"]), n_ctx=256, n_threads=1)
    engine = Engine.load(cfg)
    engine.new_slot().generate([1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True), SpecParams())
    path = engine.controller.store.path
    engine.close()
    assert path.parent == tmp_path / "auto" and path.exists()
    again = Engine.load(cfg)
    assert again.controller.verify.table(2) is not None  # it starts from the measured costs
    again.close()
    off = Engine.load(ModelConfig(cfg.target_path, cfg.draft_path, n_ctx=256, n_threads=1, auto_profile=False))
    assert off.controller.store is None
    off.close()
