"""What the bench tests share: `specserve bench` run in-process, the toy prompts, and a local runner that
records what it was sent."""
from __future__ import annotations

import contextlib
import io

from specserve.cli import main

PROMPTS = ["the cat sat on the mat and the dog ran to the cat", "he was in the mat of the dog with the cat"]


def run_cli(*argv) -> tuple[int, str]:
    """`specserve ARGV` in this process: (exit status, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in argv])
    return code, out.getvalue()


class FakeLocal:
    """Answers "<config>:<prompt index>" and records what each run was sent."""

    def __init__(self):
        self.calls = []

    def run(self, config, prompt, sampling, verify, messages=None, scope=None):
        self.calls.append((config.name, prompt.index, messages, scope))
        return {"tokens_per_s": 10.0}, f"{config.name}:{prompt.index}"
