"""Benchmark workloads: the prompts each configuration is measured on.

A workload is a list of prompts. Built-in names are the Spec-Bench categories
(data/spec_bench/question.jsonl, Apache-2.0; the first turn of each question as a
user message), `spec-bench` (all categories, spread evenly), `code-edit`
(refactor/rename/fix requests about a given snippet: input-grounded, where prompt
lookup drafts well), `code-edit-long` (a rename or a small change to a whole 40-80-line
file in Python, Go, JavaScript, Rust or TypeScript, returned whole: 240-560-token
prompts, answers that copy most of them, the work of an editor's assistant) and
`multi-turn` (conversations that re-send or edit earlier answers, where cross-request
drafting pays; see `multi_turn`), `structured` (extraction, classification, nested objects and
tool calls, each prompt with its JSON Schema: run constrained to it, docs/structured.md), `long-file[:N]` and
`long-chat[:N]` (a 1-3k-token source file with an edit or a question, a conversation about one:
long_prompts.py). Any workload's name followed by `:twice` (`code-edit:twice`) sends each of its
prompts, then the same request again (turns first and retry); followed by `:again`, each of its
prompts, then every other workload of the run, then the same requests again (turns first and again:
a retry, a regenerate or an agent's resent turn comes after other requests, not back to back);
followed by `:unconstrained`, the same prompts unconstrained (still validated against their schemas:
to compare constrained with free generation in one run); followed by `@T` (`writing@0.8`), its prompts at
temperature T (a mixed workload: stories at 0.8 beside code at 0). Anything else is read as a JSONL file, one
prompt a line:

    {"prompt": "text"} or {"messages": [{"role": "user", "content": "..."}]}
    optional: "temperature", "max_tokens", "category", "chat" (false: no chat template),
              "schema" (a JSON Schema the output is constrained to and validated against)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from .long_prompts import is_long, load_long

SPEC_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                         "humanities", "translation", "summarization", "qa", "math_reasoning", "rag")
BUILTIN_WORKLOADS = ("code-edit", "code-edit-long", "multi-turn", "structured", "long-file", "long-chat",
                     "spec-bench", *SPEC_BENCH_CATEGORIES)
TWICE = ":twice"  # a workload name's suffix: each of its prompts, then the same request again
AGAIN = ":again"  # a workload name's suffix: its prompts, the run's other workloads, then the same requests again
UNCONSTRAINED = ":unconstrained"  # a workload name's suffix: its prompts without their schemas
# The later turns of a multi-turn conversation, after the question and a retry of it.
FOLLOW_UPS = (("rename", "Rename the first function you defined to `solution`, update every use of it, and "
                         "return the whole file."),
              ("docstring", "Add a docstring (or a doc comment) to every function and return the whole file."))
TURNS = ("first", "retry", *(kind for kind, _ in FOLLOW_UPS))
TURN_KINDS = (*TURNS, "again")  # every kind of turn a workload's prompts may have (`:again`'s repeats: "again")


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of a workload; `messages` are rendered with the chat template unless chat is False.

    In a multi-turn conversation an assistant message may be {"role": "assistant", "answer_of": j}:
    the answer the same configuration gave to prompt j of the workload, filled in when it runs.
    """

    workload: str
    index: int  # position within the workload as selected
    messages: tuple[dict, ...]
    category: str = ""
    temperature: float | None = None  # the file's own setting; --temp overrides it
    max_tokens: int | None = None  # the file's own setting; -n overrides it
    chat: bool = True
    turn: str = ""  # in a multi-turn conversation: its kind, one of TURNS
    schema: dict | None = None  # a JSON Schema the output is validated against, and constrained to if `constrain`
    constrain: bool = True
    last: bool = False  # sent after every prompt of the run that is not (`:again`'s repeats: `in_run_order`)

    @property
    def answers_needed(self) -> list[int]:
        """Indices of the prompts whose answers this one re-sends."""
        return [m["answer_of"] for m in self.messages if "answer_of" in m]

    @property
    def text(self) -> str:
        """The prompt as plain text (the last user message)."""
        return self.messages[-1]["content"]


def load_workload(name_or_path: str, n_prompts: int) -> list[BenchPrompt]:
    """Up to n_prompts prompts of a built-in workload or a JSONL file, spread evenly over it."""
    if n_prompts <= 0:
        raise ValueError(f"prompts per workload must be > 0, got {n_prompts}")
    name, at, temperature = name_or_path.rpartition("@")
    if at and _is_temperature(temperature):
        return [replace(p, workload=name_or_path, temperature=float(temperature))
                for p in load_workload(name, n_prompts)]
    if name_or_path.endswith(UNCONSTRAINED):
        return [replace(p, workload=name_or_path, constrain=False)
                for p in load_workload(name_or_path[:-len(UNCONSTRAINED)], n_prompts)]
    if name_or_path.endswith(TWICE):
        return sent_twice(load_workload(name_or_path[:-len(TWICE)], -(-n_prompts // 2)), name_or_path)[:n_prompts]
    if name_or_path.endswith(AGAIN):
        return sent_again(load_workload(name_or_path[:-len(AGAIN)], -(-n_prompts // 2)), name_or_path)[:n_prompts]
    if is_long(name_or_path):
        return [BenchPrompt(name_or_path, i, messages, kind) for i, (kind, messages) in
                enumerate(load_long(name_or_path, n_prompts))]
    key = name_or_path.replace("-", "_")
    if key == "multi_turn":
        return multi_turn(n_prompts)
    if key in ("code_edit", "code_edit_long", "structured"):
        rows, name = _read_jsonl(resources.files("specserve") / "data" / f"{key}.jsonl"), key.replace("_", "-")
    elif key == "spec_bench" or key in SPEC_BENCH_CATEGORIES:
        rows, name = _spec_bench(None if key == "spec_bench" else key), key.replace("spec_bench", "spec-bench")
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"workload {name_or_path!r} is neither a built-in name "
                             f"({', '.join(BUILTIN_WORKLOADS)}) nor a JSONL file")
        rows, name = _read_jsonl(path), path.stem
    if not rows:
        raise ValueError(f"workload {name_or_path!r} has no prompts")
    picked = _spread(rows, n_prompts)
    return [_prompt(name, i, row, f"{name_or_path} prompt {i + 1}") for i, row in enumerate(picked)]


def _is_temperature(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


def multi_turn(n_prompts: int) -> list[BenchPrompt]:
    """Conversations about Spec-Bench coding questions, four requests each: the question, the same
    request again (a retry), then "rename ... return the whole file" and "add docstrings ... return
    the whole file", each re-sending the answers before it. The first n_prompts requests of
    ceil(n_prompts / 4) conversations, their questions spread over the category."""
    questions = _spread(_spec_bench("coding"), -(-n_prompts // len(TURNS)))
    prompts: list[BenchPrompt] = []
    for c, q in enumerate(questions):
        first = len(prompts)
        history: tuple[dict, ...] = ({"role": "user", "content": q["prompt"]},)
        turns = [("first", history), ("retry", history)]
        answer_of = first
        for kind, text in FOLLOW_UPS:
            history = (*history, {"role": "assistant", "answer_of": answer_of}, {"role": "user", "content": text})
            turns.append((kind, history))
            answer_of = first + len(turns) - 1
        prompts += [BenchPrompt("multi-turn", first + t, messages, kind, turn=kind)
                    for t, (kind, messages) in enumerate(turns)]
    return prompts[:n_prompts]


def sent_twice(prompts: list[BenchPrompt], name: str) -> list[BenchPrompt]:
    """Each prompt, then the same request again (turns "first" and "retry"): what a server's memory of
    earlier requests is worth when a client repeats one (a retry, a regenerate button, an agent's loop)."""
    return [replace(p, workload=name, index=2 * i + t, turn=turn)
            for i, p in enumerate(prompts) for t, turn in enumerate(("first", "retry"))]


def sent_again(prompts: list[BenchPrompt], name: str) -> list[BenchPrompt]:
    """Each prompt (turn "first"), then, after every other prompt of the run (`in_run_order`), the same
    requests again (turn "again"). Back to back (`sent_twice`) the repeat follows its first pass at once; in
    use a retry or an agent's next turn comes after other requests, which is what the server's memory of
    earlier requests and auto's learning must hold up through."""
    n = len(prompts)
    first = [replace(p, workload=name, index=i, turn="first") for i, p in enumerate(prompts)]
    return first + [replace(p, workload=name, index=n + i, turn=TURN_KINDS[-1], last=True)
                    for i, p in enumerate(prompts)]


def in_run_order(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts as a run sends them: in the order given, `:again`'s repeats after all the others."""
    return [p for p in prompts if not p.last] + [p for p in prompts if p.last]


def resolve_messages(prompt: BenchPrompt, answers: dict[int, str]) -> list[dict]:
    """The prompt's messages with earlier answers filled in (`answers`: prompt index -> text)."""
    return [{"role": m["role"], "content": answers.get(m["answer_of"], "")} if "answer_of" in m else dict(m)
            for m in prompt.messages]


def _spread(rows: list, n: int) -> list:
    """n rows at even spacing (all of them if there are no more than n): first-n would be one topic."""
    if len(rows) <= n:
        return list(rows)
    return [rows[i * len(rows) // n] for i in range(n)]


def _spec_bench(category: str | None) -> list[dict]:
    rows = _read_jsonl(resources.files("specserve") / "data" / "spec_bench" / "question.jsonl")
    out = [{"prompt": r["turns"][0], "category": r["category"]} for r in rows
           if category is None or r["category"] == category]
    if category is None:  # interleave categories so an even spread covers all of them
        by_cat: dict[str, list[dict]] = {}
        for r in out:
            by_cat.setdefault(r["category"], []).append(r)
        out = [r for group in zip(*by_cat.values()) for r in group]
    return out


def _read_jsonl(path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read workload file {path}: {e}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: each line must be a JSON object")
        rows.append(row)
    return rows


def _prompt(workload: str, index: int, row: dict, where: str) -> BenchPrompt:
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    elif isinstance(row.get("prompt"), str) and row["prompt"]:
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        raise ValueError(f"{where}: needs a non-empty 'prompt' string or a 'messages' list")
    temperature, max_tokens = row.get("temperature"), row.get("max_tokens")
    if temperature is not None and not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"{where}: temperature must be a number >= 0, got {temperature!r}")
    if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens > 0):
        raise ValueError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    schema = row.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise ValueError(f"{where}: schema must be a JSON Schema object")
    return BenchPrompt(workload, index, tuple(dict(m) for m in messages), str(row.get("category", workload)),
                       None if temperature is None else float(temperature), max_tokens,
                       bool(row.get("chat", True)), schema=schema)
