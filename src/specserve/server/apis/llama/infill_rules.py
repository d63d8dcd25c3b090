"""What /infill adds to a generation: llama-server's line rules and its response_fields.

`LineRules` ends a completion where llama-server's /infill ends it: `n_indent` cuts the text at
the first new line indented less than the cursor's line (keeping that line's indentation, as
llama-server does), and `t_max_predict_ms` stops at the first new line once that many
milliseconds of generation have passed. Both look at text as it is committed: a step that
commits several tokens (speculation) is cut at the same place in the text as one token at a
time would have been for n_indent; the time rule keeps the chunk's text up to its first
newline. (The FIM prompt itself: shared/fim_prompts.py.)
"""
from __future__ import annotations

import time


class LineRules:
    """n_indent and t_max_predict_ms over the text generated so far."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int = 0, t_start: float | None = None):
        self.n_indent = n_indent
        self.t_max = t_max_predict_ms / 1000
        self.t_start = time.perf_counter() if t_start is None else t_start
        self.text = ""
        self._line = 0  # where the line under check starts in self.text (just after a newline), 0: none yet
        self.stopped = False

    def push(self, chunk: str) -> str:
        """The part of `chunk` to keep; sets `stopped` when generation should end here."""
        if self.stopped:
            return ""
        start = len(self.text)
        self.text += chunk
        if self.n_indent > 0:
            cut = self._indent_cut()
            if cut is not None:
                self.stopped = True
                self.text = self.text[:cut]
                return self.text[start:]
        if self.t_max > 0 and "\n" in chunk and time.perf_counter() - self.t_start > self.t_max:
            self.stopped = True
            self.text = self.text[:start + chunk.index("\n") + 1]
            return self.text[start:]
        return chunk

    def _indent_cut(self) -> int | None:
        """Where the first line (after a newline) indented less than n_indent starts its text."""
        text = self.text
        while True:
            if self._line == 0:
                nl = text.find("\n")
                if nl < 0:
                    return None
                self._line = nl + 1
            pos = self._line
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos >= len(text):
                return None  # the line's indentation is not known yet
            if pos - self._line < self.n_indent:  # an empty line too, as in llama-server
                return pos
            nl = text.find("\n", self._line)
            if nl < 0:
                return None
            self._line = nl + 1


def select_fields(answer: dict, paths: list[str]) -> dict:
    """llama-server's `response_fields`: only these fields, each under its path as the key
    ("timings/prompt_n": the value of answer["timings"]["prompt_n"]); paths not found are left out."""
    out = {}
    for path in paths:
        node, found = answer, True
        for part in path.split("/"):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                found = False
                break
        if found:
            out[path] = node
    return out
