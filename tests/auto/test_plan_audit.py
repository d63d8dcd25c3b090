"""tools/plan_audit: auto's own trace lines, from a replayed sequence of requests, tallied per drafter."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from replay import Replay, code_edit, question, story
from specserve.auto import Controller
from specserve.config import SpecParams
from specserve.measure import plan_audit


def test_the_audit_tallies_every_step_of_the_trace(caplog, tmp_path, capsys):
    rng = np.random.default_rng(3)
    replay = Replay(Controller(), seed=3)
    with caplog.at_level(logging.DEBUG, logger="specserve.auto"):
        runs = [replay.run(t, SpecParams()) for t in (code_edit(rng), question(rng), story(rng))]
    lines = [r.getMessage() for r in caplog.records if r.name == "specserve.auto"]
    tallies = plan_audit.audit(lines)

    # every step but the fresh engine's first (planned before any pass was measured) and those the replay cut
    # to plain decoding at an answer's end (as the engine does at max_tokens), which ran no plan of theirs
    planned = [line for line in lines if "planned plain (measuring)" not in line]
    steps = [s for r in runs for s in r.steps][1:]
    assert len(steps) == len(planned)
    kept = [s for s, line in zip(steps, planned) if "ran plain" not in line or "planned plain" in line]
    assert sum(t.steps for t in tallies.values()) == len(kept)
    assert sum(t.made for t in tallies.values()) == sum(s.accepted + 1 for s in kept)
    by_drafter: dict[str, int] = {}
    for (_, name, _), t in tallies.items():
        by_drafter[name] = by_drafter.get(name, 0) + t.steps
    expected: dict[str, int] = {}
    for s in kept:
        expected[s.drafter or "plain"] = expected.get(s.drafter or "plain", 0) + 1
    assert by_drafter == expected
    assert {regime for regime, _, _ in tallies} == {0.0, 0.75}  # the story ran at 0.8
    # plain decoding's plan is the measured pass, which the replay's table repeats exactly
    plain = [t for (_, name, how), t in tallies.items() if name == "plain" and how == "plan"]
    assert plain and all(t.worth == pytest.approx(1.0, abs=0.02) for t in plain)

    log = tmp_path / "trace.log"
    log.write_text("\n".join(f"DEBUG specserve.auto: {line}" for line in lines) + "\nINFO unrelated line\n")
    assert plan_audit.main([str(log)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["regime", "drafter", "chosen", "by", "steps", "tokens", "tok/s",
                                           "promised", "worth"]
    rows = [line.split() for line in out.splitlines()[1:]]
    assert {(r[0], r[1], r[2]) for r in rows} == {(f"T{g:.2f}", n, how) for g, n, how in tallies}


def test_a_log_without_the_trace_says_how_to_get_it(tmp_path, capsys):
    log = tmp_path / "info.log"
    log.write_text("INFO specserve: serving on :8080\n")
    assert plan_audit.main([str(log)]) == 1
    assert "SPECSERVE_LOG=debug" in capsys.readouterr().err
