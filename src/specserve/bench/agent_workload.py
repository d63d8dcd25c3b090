"""The agent-loop workload: a coding agent's conversation, as Claude-Code- or Codex-style agents hold it.

Each conversation is about one real source file nobody here wrote: a run of consecutive top-level
functions of a module of the running Python's standard library (AGENT_MODULES, found by module path,
cut to at most `max_chars`). The agent's turns, each request re-sending the whole conversation with
the tools declared:

    read    the user asks for a change to the file; the model must call read_file (tool choice forced,
            one call)
    edit    the tool's result carries the file; the model writes the whole file back with the change
    edit-2  the user asks for a second change; the model writes the whole file back again

The read turn's call is replaced in the history by the canonical read_file call (so that every
server sees the same conversation, whatever its model wrote), and the edit turns' answers are each
configuration's own: greedy, every lossless configuration holds the very same conversation. Messages
are held neutrally and written as Anthropic Messages or OpenAI chat by `anthropic_body` / `chat_body`.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from .fim_workload import module_file

AGENT_MODULES = ("colorsys", "bisect", "fnmatch", "textwrap", "glob", "heapq", "base64", "copy", "html",
                 "mimetypes")  # excerpts of 1.5-2.4k characters on Python 3.11
MAX_CHARS = 2400  # the excerpt's most characters: about 700 tokens of Python, so that three copies fit a 4096 context
TURNS = ("read", "edit", "edit-2")
SYSTEM = ("You are a coding agent working in the user's repository. Read files with the read_file tool before "
          "you change them. When asked for a file back, reply with the whole file in one ```python code block "
          "and nothing else.")
READ_FILE = {"name": "read_file", "description": "Read a file of the repository and return its text.",
             "schema": {"type": "object", "properties": {"path": {"type": "string", "description": "the file's path"}},
                        "required": ["path"], "additionalProperties": False}}


@dataclass(frozen=True)
class AgentTask:
    """One conversation: the file, its text as the tool returns it, and the two changes asked for."""

    path: str  # e.g. json/decoder.py
    text: str
    function: str  # the function the first change renames
    new_name: str

    @property
    def ask(self) -> str:
        return (f"In {self.path}, rename the function `{self.function}` to `{self.new_name}` and update every use "
                "of it in the file. Read the file first, then reply with the whole updated file.")

    @property
    def second(self) -> str:
        return ("Now also add a one-line docstring to every function that has none (keep the existing ones "
                "unchanged). Reply with the whole file again.")

    def edit_done(self, text: str) -> bool:
        """Whether an answer holds the renamed function and no longer the old name as a definition."""
        return f"def {self.new_name}(" in text and f"def {self.function}(" not in text


def excerpt(source: str, max_chars: int = MAX_CHARS) -> tuple[str, str]:
    """(text, first function's name): the module's top-level statements from its first function on, as
    many as fit max_chars (the function alone if it does not), as the file's text."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    first = next((i for i, n in enumerate(tree.body) if isinstance(n, ast.FunctionDef)), None)
    if first is None:
        raise ValueError("no top-level function")
    node = tree.body[first]
    start, end = node.lineno - 1 - len(node.decorator_list), node.end_lineno
    for node in tree.body[first + 1:]:
        if len("".join(lines[start:node.end_lineno])) > max_chars:
            break
        end = node.end_lineno
    return "".join(lines[start:end]), tree.body[first].name


def agent_tasks(n: int, max_chars: int = MAX_CHARS, modules: tuple[str, ...] = AGENT_MODULES) -> list[AgentTask]:
    """n conversations, one per module (n at most len(modules))."""
    if not 0 < n <= len(modules):
        raise ValueError(f"agent-loop has {len(modules)} files: give 1 to {len(modules)} conversations, got {n}")
    tasks = []
    for name in modules[:n]:
        text, function = excerpt(module_file(name).read_text(encoding="utf-8"), max_chars)
        tasks.append(AgentTask(name.replace(".", "/") + ".py", text, function, function.lstrip("_") + "_renamed"))
    return tasks


def history(task: AgentTask, turn: str, answers: dict[str, str]) -> list[dict]:
    """The neutral messages a turn sends: {"role", "text"} or {"role": "assistant", "call": {...}} or
    {"role": "tool", "id", "text"}; `answers`: this configuration's earlier answers by turn."""
    msgs = [{"role": "system", "text": SYSTEM}, {"role": "user", "text": task.ask}]
    if turn == "read":
        return msgs
    call = {"id": "toolu_read_1", "name": READ_FILE["name"], "input": {"path": task.path}}
    msgs += [{"role": "assistant", "call": call}, {"role": "tool", "id": call["id"], "text": task.text}]
    if turn == "edit":
        return msgs
    return msgs + [{"role": "assistant", "text": answers.get("edit", "")}, {"role": "user", "text": task.second}]


def anthropic_body(msgs: list[dict], forced: bool) -> dict:
    """The messages as an Anthropic /v1/messages body's system, messages, tools and tool_choice."""
    out: list[dict] = []
    for m in msgs[1:]:
        if m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["id"], "content": m["text"]}
            out.append({"role": "user", "content": [result]})
        elif "call" in m:
            c = m["call"]
            out.append({"role": "assistant", "content": [{"type": "tool_use", "id": c["id"], "name": c["name"],
                                                          "input": c["input"]}]})
        else:
            out.append({"role": m["role"], "content": m["text"]})
    tool = {"name": READ_FILE["name"], "description": READ_FILE["description"], "input_schema": READ_FILE["schema"]}
    choice = {"type": "any", "disable_parallel_tool_use": True} if forced else {"type": "auto"}
    return {"system": msgs[0]["text"], "messages": out, "tools": [tool], "tool_choice": choice}


def chat_body(msgs: list[dict], forced: bool) -> dict:
    """The messages as an OpenAI /v1/chat/completions body's messages, tools and tool_choice."""
    out: list[dict] = []
    for m in msgs:
        if m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["id"], "content": m["text"]})
        elif "call" in m:
            c = m["call"]
            function = {"name": c["name"], "arguments": json.dumps(c["input"])}
            out.append({"role": "assistant", "content": None,
                        "tool_calls": [{"id": c["id"], "type": "function", "function": function}]})
        else:
            out.append({"role": m["role"], "content": m["text"]})
    tool = {"type": "function", "function": {"name": READ_FILE["name"], "description": READ_FILE["description"],
                                             "parameters": READ_FILE["schema"]}}
    return {"messages": out, "tools": [tool], "tool_choice": "required" if forced else "auto",
            **({"parallel_tool_calls": False} if forced else {})}
