"""The interference tool's window arithmetic (tools/interference.py), on hand-made token times.

The tool itself runs against a real server in server/test_server_batch.py (it needs that file's
--parallel 3 server)."""
from __future__ import annotations

import pytest

from specserve.measure.interference import span, tpot, tpot_between


def test_interference_tpot_counts_a_stall():
    times = [0.0, 0.1, 0.2, 0.3, 1.3, 1.4]  # a 1 s stall from 0.3
    assert tpot(times, 0.0, 0.3) == pytest.approx(0.1)
    assert tpot(times, 0.35, 1.0) == pytest.approx(1.0)  # from the token before to the token after
    assert tpot(times, 0.35, 2.0) is None  # the stream ended before the window did


def test_interference_control_is_timed_over_the_measured_positions():
    measured = [0.0, 0.1, 0.2, 0.3, 1.3, 1.4]
    control = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]  # the same stream with nothing arriving
    window = span(measured, 0.35, 1.0)
    assert window == (3, 4)
    assert tpot_between(control, window) == pytest.approx(0.1)
    assert tpot_between(control[:4], window) is None  # the control stream ended sooner
    chunked = [0.0, 0.1, 0.4, 0.4, 0.4, 0.5]  # positions 3 and 4 came in one chunk, with 2
    assert tpot_between(chunked, window) == pytest.approx(0.1)  # from the chunk before: 3 tokens in 0.3 s
