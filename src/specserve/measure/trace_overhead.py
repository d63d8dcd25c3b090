"""What `"speculative": {"trace": true}` costs a streamed answer (docs/webui.md).

    specserve serve --no-cross-request &
    python -m specserve.measure.trace_overhead --url http://127.0.0.1:8080 --rounds 5

The packaged code-edit prompts, greedy and streamed, each sent twice in a row, trace off and on
in alternating order; reports the median paired ratio on/off of the server's decoding speed
(usage.speculative.tokens_per_s) and of the client's tokens from the first chunk of text to the last
(which also pays the trace's JSON on the event loop and on the wire). Greedy answers are the same
both ways, so the pairs differ by the trace alone. --no-cross-request on the server keeps the second
of a pair from drafting from the first's answer.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from ..bench.workloads import load_workload


def run_one(url: str, messages: list[dict], trace: bool, max_tokens: int, headers: dict) -> tuple[float, float]:
    """(server tok/s, client tok/s) of one streamed answer; the client's counts from the first chunk of
    text to the last (as vLLM's time per output token), so that the prompt, which the second request
    of a pair finds cached, does not enter it."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "speculative": {"trace": trace}}
    usage, t_first, t_last = None, 0.0, 0.0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                t_last = time.perf_counter()
                t_first = t_first or t_last
    return usage["speculative"]["tokens_per_s"], (usage["completion_tokens"] - 1) / max(t_last - t_first, 1e-9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.trace_overhead", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key")
    p.add_argument("--rounds", type=int, default=5, help="passes over the prompts (default 5)")
    p.add_argument("--prompts", type=int, default=4, help="code-edit prompts used (default 4)")
    p.add_argument("--max-tokens", type=int, default=160)
    args = p.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    prompts = [list(w.messages) for w in load_workload("code-edit", args.prompts)]
    ratios: dict[str, list[float]] = {"server": [], "client": []}
    for r in range(args.rounds):
        for i, messages in enumerate(prompts):
            order = (False, True) if (r + i) % 2 else (True, False)
            got = {trace: run_one(args.url.rstrip("/"), messages, trace, args.max_tokens, headers) for trace in order}
            ratios["server"].append(got[True][0] / got[False][0])
            ratios["client"].append(got[True][1] / got[False][1])
    out = {k: round(statistics.median(v), 3) for k, v in ratios.items()}
    print(json.dumps({"pairs": len(ratios["server"]), "median_on_over_off": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
