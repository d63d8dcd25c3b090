"""The agents' APIs through the official SDKs, unmodified, against a running server: one round trip each.

    python -m specserve.measure.agent_sdks --url http://127.0.0.1:8080 [--api-key KEY] [--model NAME]

Anthropic (`pip install anthropic`): a message, the same streamed, a tool_use -> tool_result round
trip, count_tokens. OpenAI Responses (`openai`): a response, the same streamed, a function_call ->
function_call_output round trip. The round trips' first request forces the call (tool_choice any /
required), the second answers under auto. Greedy (temperature 0, as `extra_body`: the Anthropic SDK has no
sampling parameters of its own). Each step prints what came back and, where the server reports it
(specserve's usage.speculative), what speculation did; the exit status is the number of steps that
failed. The same script runs against llama-server, which serves both APIs.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
ASK = "What is the weather in Paris? Use the tool."
GREEDY = {"temperature": 0}


def _spec(usage) -> str:
    spec = getattr(usage, "speculative", None) or (usage.model_extra or {}).get("speculative") if usage else None
    if not spec:
        return "no usage.speculative"
    return (f"drafted {spec['drafted']} accepted {spec['accepted']} ({100 * spec['acceptance']:.0f}%), "
            f"{spec['passes']} passes, steps {spec['drafter_steps']}, {spec['tokens_per_s']} tok/s")


def anthropic_steps(url: str, key: str, model: str, max_tokens: int) -> list:
    import anthropic

    c = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=600)
    tools = [{"name": "get_weather", "description": "The weather now in a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": ASK}]

    def create():
        m = c.messages.create(model=model, max_tokens=max_tokens, system="Be brief.",
                              messages=[{"role": "user", "content": "Write a haiku about the sea."}], extra_body=GREEDY)
        return f"{m.stop_reason}: {m.content[0].text!r} | {_spec(m.usage)}"

    def stream():
        with c.messages.stream(model=model, max_tokens=max_tokens, system="Be brief.", extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Write a haiku about the sea."}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        return f"{final.stop_reason}: {text!r} ({final.usage.output_tokens} tokens)"

    def round_trip():
        m = c.messages.create(model=model, max_tokens=max_tokens, messages=ask, tools=tools,
                              tool_choice={"type": "any"}, extra_body=GREEDY)
        calls = [b for b in m.content if b.type == "tool_use"]
        if not calls:
            return f"no tool_use ({m.stop_reason}): {m.content}"
        history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "21 C, sunny"}
                                                for b in calls]}]
        final = c.messages.create(model=model, max_tokens=max_tokens, messages=history, tools=tools, extra_body=GREEDY)
        n = c.messages.count_tokens(model=model, messages=history, tools=tools).input_tokens
        return (f"tool_use {[(b.name, b.input) for b in calls]} -> {final.stop_reason}: "
                f"{''.join(b.text for b in final.content if b.type == 'text')!r} | count_tokens {n} "
                f"| {_spec(final.usage)}")

    return [("anthropic messages.create", create), ("anthropic messages.stream", stream),
            ("anthropic tool_use -> tool_result, count_tokens", round_trip)]


def responses_steps(url: str, key: str, model: str, max_tokens: int) -> list:
    import openai

    c = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key or "none", max_retries=0, timeout=600)
    tools = [{"type": "function", "name": "get_weather", "description": "The weather now in a city",
              "parameters": WEATHER}]

    def create():
        r = c.responses.create(model=model, instructions="Be brief.", input="Write a haiku about the sea.",
                               max_output_tokens=max_tokens, temperature=0)
        return f"{r.status}: {r.output_text!r} | {_spec(r.usage)}"

    def stream():
        with c.responses.stream(model=model, instructions="Be brief.", input="Write a haiku about the sea.",
                                max_output_tokens=max_tokens, temperature=0) as s:
            kinds = [e.type for e in s]
        return f"{len(kinds)} events: {kinds[0]} ... {kinds[-1]}"

    def round_trip():
        r = c.responses.create(model=model, input=ASK, tools=tools, tool_choice="required",
                               max_output_tokens=max_tokens, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            return f"no function_call ({r.status}): {r.output_text!r}"
        history = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in r.output],
                   *[{"type": "function_call_output", "call_id": o.call_id, "output": "21 C, sunny"} for o in calls]]
        final = c.responses.create(model=model, input=history, tools=tools, max_output_tokens=max_tokens, temperature=0)
        return (f"function_call {[(o.name, json.loads(o.arguments)) for o in calls]} -> {final.status}: "
                f"{final.output_text!r} | {_spec(final.usage)}")

    return [("openai responses.create", create), ("openai responses.stream", stream),
            ("openai function_call -> function_call_output", round_trip)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default="any", help="the model name sent (any name is served by specserve)")
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    args = p.parse_args(argv)
    failed = 0
    for name, step in [*anthropic_steps(args.url, args.api_key, args.model, args.max_tokens),
                       *responses_steps(args.url, args.api_key, args.model, args.max_tokens)]:
        try:
            print(f"{name}: {step()}")
        except Exception:  # a hand-run check: say what failed and go on to the next step
            failed += 1
            print(f"{name}: FAILED\n{traceback.format_exc(limit=2)}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
