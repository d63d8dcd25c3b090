"""The fim-replay workload: editing real source files that nobody here wrote, as an editor asks.

The files are modules of the running Python's standard library (FIM_MODULES, found by module
path, so nothing is copied into this repository). Down each file, at evenly spaced lines of code,
the developer is about to write that line: the cursor sits after its indentation, the text above
is the prefix and the text below the suffix (llama.vim's local context: 256 lines above, 64
below, the current line's rest empty), and the editor asks for the rest of the line or block.
Then it asks again as if the developer had typed a few more characters of the real line
(KEYSTROKES): each of those requests repeats the one before with a longer `prompt`, which is
where a server's prompt cache and speculation from the text around the cursor pay. The answer
is judged against the file's real continuation: does its first line equal the rest of the line?
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

FIM_MODULES = ("json.decoder", "textwrap", "shlex", "heapq", "fnmatch", "csv", "string", "calendar")
KEYSTROKES = (0, 2, 5)  # characters of the real line typed before each request at a cut
N_PREFIX, N_SUFFIX = 256, 64  # lines of local context above and below the cursor (llama.vim's defaults)
MIN_LINE = 12  # a cut line has at least this many characters of code after its indentation


@dataclass(frozen=True)
class FimCase:
    """One request of the replay: where in which file, what was typed, what the file really has."""

    file: str  # the module's path relative to the standard library, e.g. json/decoder.py
    line: int  # 0-based line of the cursor
    typed: int  # characters of the line typed after its indentation (0: the first request at this cut)
    prefix: str  # the lines above, each ending in "\n"
    suffix: str  # "\n" and the lines below
    prompt: str  # the current line up to the cursor (indentation and what was typed)
    truth: str  # the rest of the real line
    n_indent: int  # the line's indentation, as llama.vim sends it

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line + 1}+{self.typed}"

    def matches(self, content: str) -> bool:
        """Whether the suggestion's first line is the rest of the real line."""
        return content.split("\n", 1)[0].rstrip() == self.truth.rstrip()


def module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"fim-replay: the standard library module {name} has no Python source here")
    return Path(spec.origin)


def _is_code(stripped: str) -> bool:
    return (len(stripped) >= MIN_LINE and not stripped.startswith(("#", '"', "'", ")", "]", "}"))
            and (stripped[0].isalpha() or stripped[0] == "_"))


def cut_lines(lines: list[str], n: int) -> list[int]:
    """n lines of code spread evenly down the file (not comments, strings or closing brackets)."""
    code = [i for i, line in enumerate(lines) if _is_code(line.strip()) and i >= 3]
    if len(code) <= n:
        return code
    return [code[j * len(code) // n] for j in range(n)]


def cases_for(path: Path, n_cuts: int, label: str) -> list[FimCase]:
    lines = path.read_text(encoding="utf-8").splitlines()
    cases = []
    for i in cut_lines(lines, n_cuts):
        line = lines[i]
        indent = len(line) - len(line.lstrip(" \t"))
        prefix = "".join(x + "\n" for x in lines[max(0, i - N_PREFIX):i])
        suffix = "\n" + "".join(x + "\n" for x in lines[i + 1:i + 1 + N_SUFFIX])
        for typed in KEYSTROKES:
            if indent + typed >= len(line):
                break
            cases.append(FimCase(label, i, typed, prefix, suffix, line[:indent + typed], line[indent + typed:],
                                 indent))
    return cases


def fim_replay(n_cuts: int, modules: tuple[str, ...] = FIM_MODULES) -> list[list[FimCase]]:
    """The replay: per file, its requests in editing order; n_cuts cut points in all, spread over the files."""
    per_file = [n_cuts // len(modules) + (1 if j < n_cuts % len(modules) else 0) for j in range(len(modules))]
    out = []
    for name, n in zip(modules, per_file):
        if n <= 0:
            continue
        cases = cases_for(module_file(name), n, name.replace(".", "/") + ".py")
        if cases:
            out.append(cases)
    return out
