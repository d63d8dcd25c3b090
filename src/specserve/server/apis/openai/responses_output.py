"""The shapes of a /v1/responses answer, whole or streamed: the `response` object, its output items and usage.

A response's `output` is a list of items: a `message` (one `output_text` part), then a `function_call`
per tool call read back (`call_id` is the id the client sends back with `function_call_output`), after a
`reasoning` item (its text as one `reasoning_text` part) where the answer reasoned. The status is `completed`, or
`incomplete` with `incomplete_details.reason` "max_output_tokens" when the limit ended the answer (as
OpenAI's API says it). `usage` carries `speculative`, as every API's usage does here.
"""
from __future__ import annotations

import time
import uuid

from ...core.answer import speculative_usage
from ...core.jobs import Job
from ...core.request import GenRequest
from .protocol import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text(text)] if status != "in_progress" else []}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "encrypted_content": None,
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def usage(job: Job) -> dict:
    s = job.stats
    return {"input_tokens": s.n_prompt, "input_tokens_details": {"cached_tokens": s.n_cached},
            "output_tokens": s.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.n_prompt + s.n_generated, "speculative": speculative_usage(job)}


class ResponseHead:
    """What every form of one response repeats: its id, creation time, and the request's settings
    echoed as OpenAI's API echoes them."""

    def __init__(self, req: GenRequest, fields: ResponsesRequest):
        self.id = new_id("resp")
        self.created_at = int(time.time())
        s = req.sampling
        fmt = fields.text.format.model_dump(by_alias=True, exclude_none=True) if fields.text and fields.text.format \
            else {"type": "text"}
        self.settings = {
            "instructions": fields.instructions, "max_output_tokens": fields.max_output_tokens,
            "model": fields.model or req.model, "parallel_tool_calls": fields.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": fields.reasoning_effort(), "summary": None},
            "store": False, "temperature": s.temperature, "text": {"format": fmt},
            "tool_choice": fields.tool_choice if fields.tool_choice is not None else "auto",
            "tools": list(fields.tools or []), "top_p": s.top_p, "truncation": "disabled",
            "metadata": dict(fields.metadata or {})}

    def response(self, status: str, output: list[dict], job: Job | None = None, reason: str | None = None) -> dict:
        """The response object: `status` "in_progress" (no usage yet), or the finished one whose finish
        `reason` says whether it is complete."""
        if status != "in_progress" and reason == "length":
            status = "incomplete"
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                **self.settings, "output": output, "usage": usage(job) if job is not None else None}
