"""perf_hotpath host (measure/host_step.py): a replay without the passes makes exactly the recorded run's passes
and tokens, under auto and --spec draft, greedy and sampled, and times every part of the step it names."""
import pytest

from specserve.config import SamplingParams
from specserve.engine import Engine
from specserve.measure import host_step


@pytest.mark.parametrize("mode", ["auto", "draft"])
@pytest.mark.parametrize("params, method", [
    (SamplingParams(seed=1, max_tokens=24, ignore_eos=True), "gumbel"),
    (SamplingParams(seed=2, max_tokens=24, ignore_eos=True, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
     "rejection"),
])
def test_a_replay_makes_the_recorded_passes_and_times_the_parts(tiny_models, mode, params, method):
    slot = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = tiny_models["target"].tokenize("Once upon a time there was")
    record = host_step.Record()
    host_step.run(slot, prompt, params, method, 4, record, mode=mode)
    assert record.passes and len(record.tokens) == 24
    for on in (True, False):  # run() raises if a replayed pass or token differs from the record
        steps = host_step.run(slot, prompt, params, method, 4, record, host_step.Clock(on=on), mode)
        assert steps and all(s["total"] > 0 for s in steps)
        assert (sum(s["draft draws"] for s in steps) > 0) == on  # parts are timed only with the clock on
        assert (sum(s["verify"] for s in steps) > 0) == on
    out = host_step.measure(slot, prompt, params, method, 4, 1, (None, 3), mode)
    assert set(out) == {"no logprobs", "logprobs 3"} and out["logprobs 3"]["ms"]["logprobs"]["min"] > 0
