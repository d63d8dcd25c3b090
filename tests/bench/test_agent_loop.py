"""`specserve bench --workload agent-loop`: the conversations, and a run on a tiny tool-calling pair
through the bench's own server and another server given as --endpoint, over both agents' APIs."""
from __future__ import annotations

import ast
import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from specserve.bench.agent_workload import (AGENT_MODULES, MAX_CHARS, TURNS, agent_tasks, anthropic_body, chat_body,
                                            history)
from specserve.cli import main
from specserve.cli.bench_agent import apis_of
from specserve.cli.common import CliError

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, tiny_tools_pair  # noqa: E402


def test_each_conversation_is_a_real_file_cut_at_top_level_statements():
    tasks = agent_tasks(len(AGENT_MODULES))
    assert len({t.path for t in tasks}) == len(AGENT_MODULES)
    for t in tasks:
        assert 0 < len(t.text) <= MAX_CHARS and t.text.startswith(f"def {t.function}(")
        ast.parse(t.text)  # whole statements: the excerpt is itself a Python file
        assert t.edit_done(t.text.replace(f"def {t.function}(", f"def {t.new_name}("))
        assert not t.edit_done(t.text)
    with pytest.raises(ValueError):
        agent_tasks(len(AGENT_MODULES) + 1)


def test_each_turn_resends_the_conversation_before_it_in_both_apis():
    task = agent_tasks(1)[0]
    turns = [history(task, turn, {"edit": "EDITED FILE"}) for turn in TURNS]
    for before, after in zip(turns, turns[1:]):
        assert after[:len(before)] == before  # each request extends the one before it
    read, edit, edit2 = ([anthropic_body(m, t == "read") for m, t in zip(turns, TURNS)],
                         [chat_body(m, t == "read") for m, t in zip(turns, TURNS)])[0]
    assert read["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True} and len(read["messages"]) == 1
    assert edit["tool_choice"] == {"type": "auto"}
    assert edit["messages"][1]["content"][0]["type"] == "tool_use"
    assert edit["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_read_1",
                                                 "content": task.text}
    assert edit2["messages"][3] == {"role": "assistant", "content": "EDITED FILE"}
    chat = chat_body(turns[2], False)["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert json.loads(chat[2]["tool_calls"][0]["function"]["arguments"]) == {"path": task.path}
    assert chat[3]["content"] == task.text and chat_body(turns[0], True)["parallel_tool_calls"] is False


def test_the_workload_name_picks_the_apis():
    assert apis_of(["agent-loop"]) == ("messages", "chat")
    assert apis_of(["agent-loop:chat"]) == ("chat",)
    for bad in (["agent-loop:responses"], ["agent-loop", "code-edit"]):
        with pytest.raises(CliError):
            apis_of(bad)


@pytest.fixture(scope="module")
def tools_pair(tmp_path_factory):
    return tiny_tools_pair(tmp_path_factory.mktemp("agent_bench"))


def test_the_agent_loop_through_the_bench_server_and_an_endpoint(tools_pair, tmp_path):
    target, draft = tools_pair
    # the tiny vocabulary spells an excerpt in ~3k tokens: a large context for three copies of it
    other = ServerProcess(["-m", str(target), "-t", "1", "-c", "8192", "--spec", "none"], tmp_path / "other.log")
    small = ServerProcess(["-m", str(target), "-t", "1", "-c", "2048"], tmp_path / "small.log")  # refuses the edits
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["bench", "-m", str(target), "-md", str(draft), "-c", "8192", "-t", "1",
                         "--workload", "agent-loop", "--prompts-per-workload", "1", "-n", "12",
                         "--spec", "ngram", "--draft-max", "3", "--no-progress",
                         "--endpoint", f"other={other.url}", f"small={small.url}", "--json",
                         str(tmp_path / "agent.json")])
    finally:
        assert other.stop() == 0 and small.stop() == 0
    assert code == 0
    report = json.loads((tmp_path / "agent.json").read_text())
    rows = {(r["config"], r["api"], r["turn"]): r for r in report["configs"]}
    assert set(rows) == {(c, a, t) for c in ("target", "ngram k=3", "other", "small") for a in ("messages", "chat")
                         for t in TURNS}
    for api in ("messages", "chat"):  # a server's refusal is counted, and the conversation goes on
        assert rows[("small", api, "read")]["requests"] == 1
        for turn in ("edit", "edit-2"):
            row = rows.pop(("small", api, turn))
            assert row["requests"] == 0 and row["errors"] == 1 and "2048" in row["first_error"]
    assert "error: small messages edit: " in out.getvalue()
    for key, row in rows.items():
        assert row["requests"] == 1 and row["generated_mean"] > 0, key
        assert row["ttft_p50_ms"] > 0 or key[2] == "read", key  # a call cut by max_tokens may never come
        assert row["same_as_baseline"] == 1.0, key  # greedy: every configuration's text is the target alone's
    for run in report["runs"]:
        if run["error"]:
            continue
        if run["turn"] == "read":  # the forced call, whichever API and server; the tiny model's path runs on
            # past max_tokens, and a call cut short is handed out as far as it went, or not at all
            assert run["text"].startswith('{"call": "read_file"}{"path": "') or run["text"] == "", run
        else:
            assert run["n_generated"] == 12 and run["n_cached"] >= 0
    for (config, api, turn), row in rows.items():
        if turn == "edit-2" and config != "small":  # all but the last answer and the new question came from the cache
            edit = rows[(config, api, "edit")]
            assert row["evaluated_mean"] < 0.1 * row["prompt_mean"] < edit["evaluated_mean"], (config, api)
    assert "agent-loop" in out.getvalue() and "TTFT p50 ms" in out.getvalue()
