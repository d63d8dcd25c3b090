"""The device check (scripts/device_check.sh, issue 64 item 3) can run only where a GPU is lent; what runs here:
both shell scripts parse, and its measurement (scripts/device_measure.py) runs end to end on a tiny synthetic
pair on the CPU and writes the result the table is made from."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("script", ["device_check.sh", "device_prep.sh"])
def test_the_device_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


def test_the_measurement_runs_on_a_tiny_pair_on_the_cpu(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import device_measure
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert device_measure.main(["--small", "--work", str(tmp_path / "work"), "--out", str(tmp_path), "-n", "16"]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert list(result["passes_ms"]) == [str(n) for n in device_measure.PASSES]
    assert all(t > 0 for t in result["passes_ms"].values())
    for spec in ("none", "auto"):
        assert result["specserve"][spec]["tokens_per_s"] > 0
    # the synthetic draft is the target's first layer, the rest quiet: whatever auto drafted, it kept nearly all
    auto = result["specserve"]["auto"]
    assert auto["acceptance"] > 0.8 or "draft" not in auto["drafters"]
