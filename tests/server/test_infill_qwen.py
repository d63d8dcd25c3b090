"""/infill on the real Qwen2.5-Coder 0.5B (its own FIM tokens): n_indent and t_max_predict_ms cut a
real multi-line completion where llama-server cuts it; greedy, so the three answers line up."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess  # noqa: E402
import pytest

pytestmark = [pytest.mark.server, pytest.mark.real_models]

PREFIX = "def parse(lines):\n    out = []\n    for line in lines:\n"
SUFFIX = "\n    return out\n"


def test_n_indent_and_t_max_predict_ms_on_a_real_code_model(tmp_path):
    from specserve import models

    qwen = models.ensure("qwen2.5-coder-0.5b")
    srv = ServerProcess(["-m", str(qwen), "-c", "1024", "--parallel", "1", "--spec", "none", "-t", "2"],
                        tmp_path / "serve.log")
    base = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "        ", "n_predict": 12,
            "temperature": 0}
    try:
        with srv.client() as c:
            def infill(**over) -> dict:
                r = c.post("/infill", json={**base, **over})
                assert r.status_code == 200, r.text
                return r.json()

            full = infill()["content"]  # ' out.append(line.strip())\n    return out...'
            nl = full.index("\n")
            rest = full[nl + 1:]
            indent = len(rest) - len(rest.lstrip(" "))
            assert 0 < indent < 8 and rest.strip()  # a line less indented than the loop's body follows
            cut = infill(n_indent=8)
            assert cut["content"] == full[:nl + 1 + indent] and cut["stop_type"] == "limit"
            assert cut["tokens_predicted"] < 12
            timed = infill(t_max_predict_ms=1)
            assert timed["content"] == full[:nl + 1] and timed["stop_type"] == "limit"
    finally:
        assert srv.stop() == 0


def test_a_cursor_inside_a_word_is_healed(tmp_path):
    """The prompt's last token is backed off and the answer must begin with its text: `out.app`
    goes on as `end(` (not `ends(`), and an indented empty line does not get a ninth space."""
    from specserve import models

    qwen = models.ensure("qwen2.5-coder-0.5b")
    srv = ServerProcess(["-m", str(qwen), "-c", "1024", "--parallel", "1", "--spec", "auto", "-t", "2"],
                        tmp_path / "serve.log")
    try:
        with srv.client() as c:
            def infill(prompt: str) -> dict:
                r = c.post("/infill", json={"input_prefix": "import os\n\n\n" + PREFIX, "input_suffix": SUFFIX,
                                            "prompt": prompt, "n_predict": 12, "temperature": 0})
                assert r.status_code == 200, r.text
                return r.json()

            assert infill("        out.app")["content"].startswith("end(")
            assert infill("        ")["content"].startswith("out.append(")
            typed = infill("        out.append(")  # a keystroke later: only the new tokens are evaluated
            assert typed["content"].startswith("line")
            assert typed["tokens_evaluated"] - typed["tokens_cached"] <= 3, typed
    finally:
        assert srv.stop() == 0
