"""What auto's plans promised against what their steps made, per drafter, read from auto's trace.

    SPECSERVE_LOG=debug specserve bench --via inprocess --spec auto ... 2> trace.log
    SPECSERVE_LOG=debug specserve serve ... 2> trace.log   # or a server, with your own client
    python -m specserve.measure.plan_audit trace.log [more.log ...]

(A served bench's trace is its own server's stderr, which the bench does not keep: use --via inprocess.)

Each line of the trace (auto/request.py, AutoPolicy._trace) says what the step planned (drafter, k, the
plan's expected tokens a second, whether it was a probe) and what ran (tokens drafted and kept, seconds
drafting and verifying). Per temperature regime, drafter and planned-or-probe, this prints the steps, the
tokens they made and at what rate, and `worth`: tokens made per token the plan's rate promised in the
seconds the steps took (1.00: as planned). Plain decoding is the yardstick: its plan is a measured pass,
so its worth is the timing noise. A drafter whose worth sits well below 1 is chosen on promises its steps
do not keep (docs/cross-request.md, "What auto's plans promise": a lookup's coding steps made half of it).
Seconds a draft model spent catching up on text it had not seen count against its steps here, while the
plan's rate leaves them out: read a model drafter's worth beside its lags in the trace.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

_STEP = re.compile(
    r"step \d+ T(?P<regime>[\d.]+): planned (?P<planned>\S+) k=\d+ rate (?P<rate>[\d.]+) tok/s.*?"
    r"(?P<probe> probe of \S+)?; ran (?P<ran>\S+) k=\d+ drafted (?P<drafted>\d+) accepted (?P<accepted>\d+); "
    r"draft (?P<t_draft>[\d.]+) s verify (?P<t_verify>[\d.]+) s")


@dataclass
class Tally:
    steps: int = 0
    made: int = 0  # tokens the steps made (kept draft tokens and the target's own)
    seconds: float = 0.0  # drafting and verifying
    promised: float = 0.0  # tokens the plans' rates promised in those seconds

    @property
    def worth(self) -> float:
        return self.made / self.promised if self.promised > 0 else float("nan")


def audit(lines: Iterable[str]) -> dict[tuple[float, str, str], Tally]:
    """(regime, drafter, "plan" or "probe") -> its steps' tally. Left out: steps planned before any pass
    was measured (no rate), and steps that ran other than planned (a draft cut to nothing at max_tokens)."""
    out: dict[tuple[float, str, str], Tally] = defaultdict(Tally)
    for line in lines:
        m = _STEP.search(line)
        if m is None:
            continue
        if m["ran"] != m["planned"]:
            continue  # cut to nothing (the request's last token, its context's end): no plan of its ran
        seconds = float(m["t_draft"]) + float(m["t_verify"])
        t = out[(float(m["regime"]), m["ran"], "probe" if m["probe"] else "plan")]
        t.steps += 1
        t.made += int(m["accepted"]) + 1
        t.seconds += seconds
        t.promised += float(m["rate"]) * seconds
    return dict(out)


def report(tallies: dict[tuple[float, str, str], Tally]) -> str:
    rows = ["regime  drafter   chosen by  steps  tokens   tok/s  promised   worth"]
    for (regime, name, how), t in sorted(tallies.items()):
        rows.append(f"T{regime:<6.2f} {name:9} {how:9} {t.steps:6d} {t.made:7d} {t.made / t.seconds:7.2f} "
                    f"{t.promised:9.1f} {t.worth:7.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.plan_audit", description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", help="files holding auto's trace (SPECSERVE_LOG=debug), '-' for stdin")
    args = p.parse_args(argv)
    tallies: dict = {}
    for path in args.logs:
        with (open(path, errors="replace") if path != "-" else sys.stdin) as f:
            for key, t in audit(f).items():
                into = tallies.setdefault(key, Tally())
                into.steps, into.made = into.steps + t.steps, into.made + t.made
                into.seconds, into.promised = into.seconds + t.seconds, into.promised + t.promised
    if not tallies:
        print(f"no steps of auto's trace in {', '.join(args.logs)}: run the command with SPECSERVE_LOG=debug",
              file=sys.stderr)
        return 1
    print(report(tallies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
