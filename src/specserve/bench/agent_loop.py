"""Run the agent-loop workload (agent_workload.py) through /v1/messages and /v1/chat/completions.

Every configuration holds every conversation, turn after turn, through each API asked for: specserve's
own server (bench/served.py, the configuration as the request's `speculative` object, its own
cross-request scope) or any server given with --endpoint (llama-server serves both APIs). Each
request is streamed, greedy, with the prompt cache on as agents run it. Conversations rotate the
order of the configurations, so drift falls on all alike; a configuration runs a conversation's
turns back to back, as an agent does. Before it, every slot of its server is emptied (`flush`: a
one-token /completion with `cache_prompt: false` on each `id_slot`, which llama-server and specserve
both take), so that a conversation's first turn is cold and no configuration finds another's turns
of the same conversation in a shared server's cache.

Per turn: time to the first generated output (text or a tool call's first fragment), decode speed as
vLLM's benchmark counts it ((tokens - 1) / (last output - first output), tokens from the answer's
usage), prompt tokens the server evaluated (not read from its cache), drafts, whether the edit was
made, and whether the text is the baseline's (the target alone's: greedy, it should be always).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import httpx

from ..config import SUFFIX_MAX_DEFAULT
from .agent_workload import TURNS, AgentTask, anthropic_body, chat_body, history
from .endpoint import EndpointError

APIS = ("messages", "chat")
MAX_TOKENS = {"read": 64, "edit": 1024, "edit-2": 1024}


@dataclass
class AgentRun:
    config: str
    api: str
    task: str  # the file's path
    turn: str
    t_first_s: float  # sent -> first generated output
    t_last_s: float  # sent -> last generated output
    n_generated: int
    n_prompt: int
    n_cached: int  # prompt tokens read from the server's cache (-1: not reported)
    n_drafted: int
    n_accepted: int
    finish: str
    done: bool | None  # edit turns: the change asked for is in the answer
    text: str
    error: str = ""  # the server's refusal or failure (the conversation goes on: the next turn re-sends it)

    @property
    def tokens_per_s(self) -> float:
        span = self.t_last_s - self.t_first_s
        return (self.n_generated - 1) / span if self.n_generated > 1 and span > 0 else 0.0


def base_url(url: str) -> str:
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _lines(client: httpx.Client, url: str, body: dict):
    """The stream's `data:` objects; EndpointError for an HTTP error or an error event."""
    try:
        with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                r.read()
                raise EndpointError(f"{url}: HTTP {r.status_code}: {r.text[:300]}", r.status_code)
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    event = json.loads(line[5:])
                    if isinstance(event, dict) and (event.get("type") == "error" or "error" in event):
                        raise EndpointError(f"{url}: {event.get('error', event)}")
                    yield event
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        raise EndpointError(f"{url}: {e}") from None


def stream_messages(client: httpx.Client, url: str, body: dict) -> dict:
    """One streamed /v1/messages request: text (a tool call as its JSON), timings, usage."""
    t0 = time.perf_counter()
    t_first = t_last = 0.0
    parts, out = [], {"n_prompt": 0, "n_cached": -1, "n_generated": 0, "finish": "", "spec": {}}
    for e in _lines(client, base_url(url) + "/v1/messages", {**body, "stream": True}):
        kind = e.get("type")
        if kind == "message_start":
            u = e["message"].get("usage") or {}
            out["n_cached"] = int(u.get("cache_read_input_tokens", -1))
            out["n_prompt"] = int(u.get("input_tokens", 0)) + max(out["n_cached"], 0)
        elif kind in ("content_block_start", "content_block_delta"):
            block = e.get("content_block") or e.get("delta") or {}
            piece = block.get("text") or block.get("partial_json") or block.get("thinking") or \
                (json.dumps({"call": block["name"]}) if block.get("type") == "tool_use" else "")
            if piece:
                parts.append(piece)
                t_last = time.perf_counter() - t0
                t_first = t_first or t_last
        elif kind == "message_delta":
            out["finish"] = (e.get("delta") or {}).get("stop_reason") or ""
            u = e.get("usage") or {}
            out["n_generated"] = int(u.get("output_tokens", 0))
            out["spec"] = u.get("speculative") or {}
    return {**out, "text": "".join(parts), "t_first_s": t_first, "t_last_s": t_last}


def stream_chat(client: httpx.Client, url: str, body: dict) -> dict:
    """One streamed /v1/chat/completions request: text (tool calls as their JSON), timings, usage."""
    t0 = time.perf_counter()
    t_first = t_last = 0.0
    parts, usage, timings, finish = [], {}, {}, ""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    for e in _lines(client, base_url(url) + "/v1/chat/completions", body):
        usage, timings = e.get("usage") or usage, e.get("timings") or timings
        for choice in e.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            pieces = [delta.get("content") or ""] + [json.dumps({"call": c["function"]["name"]}) if c.get("id") else
                                                     c.get("function", {}).get("arguments") or ""
                                                     for c in delta.get("tool_calls") or []]
            if any(pieces):
                parts += pieces
                t_last = time.perf_counter() - t0
                t_first = t_first or t_last
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    spec = usage.get("speculative") or ({"drafted": timings["draft_n"], "accepted": timings.get("draft_n_accepted", 0)}
                                        if "draft_n" in timings else {})
    return {"n_prompt": int(usage.get("prompt_tokens", 0)), "n_cached": -1 if cached is None else int(cached),
            "n_generated": int(usage.get("completion_tokens", 0)), "finish": finish, "spec": spec,
            "text": "".join(parts), "t_first_s": t_first, "t_last_s": t_last}


def request_body(api: str, msgs: list[dict], turn: str, config, scope: str, model: str, max_tokens: int) -> dict:
    body = (anthropic_body if api == "messages" else chat_body)(msgs, forced=turn == "read")
    body.update(model=model, max_tokens=max_tokens, temperature=0.0)
    if config.spec != "endpoint":
        k = config.draft_max if config.spec != "none" else 0
        body["speculative"] = {"mode": config.spec, "draft_max": k, "cross_request_scope": scope,
                               "suffix_max": k if config.spec == "suffix" else SUFFIX_MAX_DEFAULT}
    return body


def flush(client: httpx.Client, url: str, max_slots: int = 64) -> int:
    """Empty every slot's cache of the server at `url`; the number of slots emptied (0: it has no
    /completion with id_slot, and nothing could be emptied). The answer names the slot that ran it:
    llama-server wraps an id past its last slot around to the first, specserve refuses it."""
    for i in range(max_slots):
        try:
            r = client.post(base_url(url) + "/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0,
                                                                 "cache_prompt": False, "id_slot": i})
            ran = r.json().get("id_slot") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            raise EndpointError(f"{url}: {e}") from None
        if ran != i:  # past the last slot
            return i
    return max_slots


def run_loop(configs, tasks: list[AgentTask], urls: dict[str, str], apis: tuple[str, ...], progress: bool = True,
             timeout: float = 1800.0, model: str = "default",
             max_tokens: dict[str, int] | None = None) -> list[AgentRun]:
    """Every configuration holds every conversation through every API; urls: configuration -> base URL;
    max_tokens: per turn (default MAX_TOKENS)."""
    max_tokens = {**MAX_TOKENS, **(max_tokens or {})}
    runs: list[AgentRun] = []
    total = len(configs) * len(tasks) * len(apis) * len(TURNS)
    with httpx.Client(timeout=timeout) as client:
        for config in configs:  # warm-up, not recorded: the model's first passes, the server's first request
            for api in apis:
                warm = request_body(api, [{"role": "system", "text": "Warm-up."}, {"role": "user", "text": "Hello."}],
                                    "edit", config, "warm", model, 8)
                (stream_messages if api == "messages" else stream_chat)(client, urls[config.name], warm)
        for t, task in enumerate(tasks):
            shift = t % len(configs)
            for config in configs[shift:] + configs[:shift]:
                c = configs.index(config)
                for api in apis:
                    if not flush(client, urls[config.name]):
                        raise EndpointError(f"{urls[config.name]}: cannot empty its slots (no /completion with "
                                            "id_slot and cache_prompt): its caches would carry over between runs")
                    answers: dict[str, str] = {}
                    for turn in TURNS:
                        body = request_body(api, history(task, turn, answers), turn, config, f"agent{c}",
                                            model, max_tokens[turn])
                        try:
                            out = (stream_messages if api == "messages" else stream_chat)(client, urls[config.name],
                                                                                           body)
                        except EndpointError as e:  # e.g. a server that cannot parse its model's tool call
                            out = {"text": "", "t_first_s": 0.0, "t_last_s": 0.0, "n_generated": 0, "n_prompt": 0,
                                   "n_cached": -1, "finish": "error", "spec": {}, "error": str(e)[:300]}
                        answers[turn] = out["text"]
                        spec = out["spec"]
                        runs.append(AgentRun(config.name, api, task.path, turn, out["t_first_s"], out["t_last_s"],
                                             out["n_generated"], out["n_prompt"], out["n_cached"],
                                             int(spec.get("drafted", 0)), int(spec.get("accepted", 0)), out["finish"],
                                             task.edit_done(out["text"]) if turn != "read" else None, out["text"],
                                             out.get("error", "")))
                        if progress:
                            print(f"\ragent-loop {len(runs)}/{total} {config.name[:36]:36s} {api:8s} {turn:6s}",
                                  end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return runs


def summarize_loop(configs, runs: list[AgentRun]) -> list[dict]:
    """One row per configuration, API and turn: medians over conversations, and against the baseline
    (the target alone, or an endpoint's --endpoint-baseline) paired by conversation."""
    rows = []
    key = lambda r: (r.api, r.task, r.turn)  # noqa: E731
    for c in configs:
        base = {key(r): r for r in runs if r.config == c.baseline}
        for api in APIS:
            for turn in TURNS:
                every = [r for r in runs if r.config == c.name and r.api == api and r.turn == turn]
                rs = [r for r in every if not r.error]
                if not every:
                    continue
                if not rs:
                    rows.append({"config": c.name, "flags": c.flags, "baseline": c.baseline, "api": api, "turn": turn,
                                 "requests": 0, "errors": len(every), "first_error": every[0].error})
                    continue
                paired = [r.tokens_per_s / base[key(r)].tokens_per_s for r in rs
                          if key(r) in base and base[key(r)].tokens_per_s > 0]
                same = [r.text == base[key(r)].text for r in rs if key(r) in base]
                done = [r.done for r in rs if r.done is not None]
                cached = [r for r in rs if r.n_cached >= 0]
                rows.append({
                    "config": c.name, "flags": c.flags, "baseline": c.baseline, "api": api, "turn": turn,
                    "requests": len(rs), "errors": len(every) - len(rs),
                    "first_error": next((r.error for r in every if r.error), ""),
                    "ttft_p50_ms": 1000 * statistics.median(r.t_first_s for r in rs),
                    "tokens_per_s": statistics.median(r.tokens_per_s for r in rs),
                    "generated_mean": statistics.fmean(r.n_generated for r in rs),
                    "prompt_mean": statistics.fmean(r.n_prompt for r in rs),
                    "evaluated_mean": statistics.fmean(r.n_prompt - r.n_cached for r in cached) if cached else None,
                    "acceptance": sum(r.n_accepted for r in rs) / max(1, sum(r.n_drafted for r in rs)),
                    "vs_baseline": statistics.median(paired) if paired else None,
                    "same_as_baseline": sum(same) / len(same) if same else None,
                    "edit_done": sum(done) / len(done) if done else None,
                })
    return rows


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_loop(rows: list[dict]) -> str:
    head = ("configuration", "api", "turn", "ok/n", "TTFT p50 ms", "decode tok/s", "vs base", "out tok", "prompt tok",
            "evaluated", "accept", "edit ok", "= base")
    table = [head]
    for r in rows:
        n = f"{r['requests']}/{r['requests'] + r['errors']}"
        if not r["requests"]:
            table.append((r["config"], r["api"], r["turn"], n, *["-"] * (len(head) - 4)))
            continue
        table.append((r["config"], r["api"], r["turn"], n, f"{r['ttft_p50_ms']:.0f}",
                      f"{r['tokens_per_s']:.1f}", _cell(r["vs_baseline"], ".2f") + ("x" if r["vs_baseline"] else ""),
                      f"{r['generated_mean']:.0f}", f"{r['prompt_mean']:.0f}", _cell(r["evaluated_mean"], ".0f"),
                      f"{100 * r['acceptance']:.0f}%", _cell(r["edit_done"] and 100 * r["edit_done"], ".0f"),
                      _cell(r["same_as_baseline"] and 100 * r["same_as_baseline"], ".0f")))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.insert(1, "-" * len(lines[0]))
    notes = ("ok/n: requests answered / sent (the first error of each row below); TTFT: request sent -> first "
             "generated output (text or a tool call's first fragment), median over conversations; decode tok/s: "
             "(tokens - 1) / (last output - first output), median; vs base: median over "
             "conversations of this decode speed / the baseline's (the target alone; an endpoint: its "
             "--endpoint-baseline); out tok: tokens generated; prompt tok: the prompt's tokens; evaluated: those the "
             "server did not read from its cache; accept: drafted tokens accepted; edit ok: % of answers with the "
             "rename made; = base: % of answers identical to the baseline's")
    errors = [f"{r['config']} {r['api']} {r['turn']}: {r['first_error']}" for r in rows if r.get("errors")]
    return "\n".join(lines) + "\n\n" + notes + "".join(f"\nerror: {e}" for e in errors)


def runs_json(runs: list[AgentRun]) -> list[dict]:
    return [{**asdict(r), "tokens_per_s": round(r.tokens_per_s, 3)} for r in runs]
