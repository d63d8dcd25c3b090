"""Long-prompt workloads: a real source file with an edit or a question about it, and a long conversation.

Where a draft model's prompt prefill and its cache grow with the prompt (docs/draft-window.md), and
where far-back text is the lookups' to copy. The files are six modules of CPython 3.11's standard
library (data/long_files, PSF License): graphlib, shlex, queue, sched, json.decoder and string,
1.3k-3.0k tokens each in Qwen2.5's tokenizer (about 4.6 characters a token).

- `long-file[:N]`: for each file, an edit of one of its functions near the top ("... return the whole
  method": the answer copies text far back in the prompt) and a question about the code; the file cut
  to about N tokens (whole lines from its start), whole without N.
- `long-chat[:N]`: a conversation about each file, three requests: the question, then the edit, then a
  follow-up, each re-sending the answers before it (the configuration's own, as `multi-turn`); the file
  cut to about N - 400 tokens, so that the last request is about N tokens at -n 128.
"""
from __future__ import annotations

import json
from importlib import resources

CHARS_PER_TOKEN = 4.6  # Qwen2.5's tokenizer on these files (1,322-3,037 tokens for 6.4-13.4k characters)
MIN_TOKENS = 256
CHAT_ROOM = 400  # tokens of a conversation's last request that are not the file: answers and questions at -n 128
FOLLOW_UP = "Now write a short unit test (unittest) for the method you just changed."
WORKLOADS = ("long-file", "long-chat")


def is_long(name: str) -> bool:
    return name.partition(":")[0] in WORKLOADS


def load_long(name: str, n_prompts: int) -> list[tuple[str, tuple[dict, ...]]]:
    """(kind, messages) of the first n_prompts prompts of `long-file[:N]` or `long-chat[:N]`; a message
    {"role": "assistant", "answer_of": j} is the answer to prompt j (workloads.BenchPrompt)."""
    kind, _, size = name.partition(":")
    tokens = None
    if size:
        try:
            tokens = int(size)
        except ValueError:
            raise ValueError(f"workload {name!r}: the length after ':' must be a number of tokens") from None
        if tokens < MIN_TOKENS:
            raise ValueError(f"workload {name!r}: the length must be >= {MIN_TOKENS} tokens")
    files = _files()
    prompts: list[tuple[str, tuple[dict, ...]]] = []
    for f in files:
        if kind == "long-file":
            text = _cut(f["text"], tokens)
            for what in ("edit", "question"):
                prompts.append((what, (_user(f["name"], text, f[what]),)))
        else:
            text = _cut(f["text"], tokens - CHAT_ROOM if tokens else None)
            first = len(prompts)
            history: tuple[dict, ...] = (_user(f["name"], text, f["question"]),)
            turns = [("question", history)]
            for turn, ask in (("edit", f["edit"]), ("follow-up", FOLLOW_UP)):
                history = (*history, {"role": "assistant", "answer_of": first + len(turns) - 1},
                           {"role": "user", "content": ask})
                turns.append((turn, history))
            prompts += turns
    return prompts[:n_prompts]


def _files() -> list[dict]:
    path = resources.files("specserve") / "data" / "long_files" / "files.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _cut(text: str, tokens: int | None) -> str:
    """The file's first whole lines, about `tokens` tokens of them (all of it with None)."""
    if tokens is None or len(text) <= tokens * CHARS_PER_TOKEN:
        return text
    end = text.rfind("\n", 0, int(tokens * CHARS_PER_TOKEN))
    return text[:end + 1] if end > 0 else text[:int(tokens * CHARS_PER_TOKEN)]


def _user(name: str, text: str, ask: str) -> dict:
    return {"role": "user", "content": f"This is `{name}`:\n\n```python\n{text}```\n\n{ask}"}
