"""A /v1/responses answer as OpenAI's stream of Responses events, each with its `sequence_number`.

    response.created, response.in_progress (the response, in progress, no output yet)
    reasoning:  response.output_item.added (reasoning), response.content_part.added,
                response.reasoning_text.delta*, response.reasoning_text.done, response.content_part.done,
                response.output_item.done
    a message:  response.output_item.added, response.content_part.added, response.output_text.delta*,
                response.output_text.done, response.content_part.done, response.output_item.done
    a call:     response.output_item.added (function_call), response.function_call_arguments.delta*,
                response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete when max_output_tokens ended it): the whole response,
                and llama-server's `timings`
With llama-server's `return_progress`, response.in_progress events with `prompt_progress` follow the first;
with `timings_per_token`, text deltas carry `timings`.

Items are numbered by `output_index` in the order they open; one is open at a time. Where tool calls
are read back, blank text is held until it is known whether a call or text follows (as in the
whole answer, blank text beside calls is no message). An error after the headers is an `error` event.
"""
from __future__ import annotations

from typing import AsyncIterator

from ...core.answer import events as answer_events
from ...core.events import CallArguments, CallStart, Finish, ReasoningText, Text
from ...core.jobs import Job
from ...http.errors import ApiError
from ..shared.prompt_progress import progress_events
from ..shared.timings import timings
from .responses_output import ResponseHead, call_item, message_item, new_id, output_text, reasoning_item


class ResponseStream:
    """One response's stream: the events, numbered, and the items they have completed."""

    def __init__(self, job: Job, head: ResponseHead, timings_per_token: bool = False, progress: bool = False):
        self.job, self.head = job, head
        self.timings_per_token, self.progress = timings_per_token, progress  # llama-server's telemetry
        self.seq = 0
        self.output: list[dict] = []  # completed items, for the final response
        self.item: dict | None = None  # the open item (its final form grows as the deltas go out)

    def _event(self, kind: str, **data) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **data}

    def error(self, err: ApiError) -> dict:
        """An error after the headers (the `render` of http/sse.sse_response)."""
        return self._event("error", code=err.code, message=err.message, param=err.param)

    def _open(self, item: dict) -> list[dict]:
        out = self._close()
        self.item = item
        out.append(self._event("response.output_item.added", output_index=len(self.output),
                               item={**item, "status": "in_progress", **({"content": []} if "content" in item
                                                                          else {"arguments": ""})}))
        if item["type"] == "reasoning":
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=len(self.output),
                                   content_index=0, part={"type": "reasoning_text", "text": ""}))
        if item["type"] == "message":
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=len(self.output),
                                   content_index=0, part=output_text("")))
        return out

    def _close(self, status: str = "completed") -> list[dict]:
        item, index = self.item, len(self.output)
        if item is None:
            return []
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"]))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   name=item["name"], arguments=item["arguments"]))
        item["status"] = status
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self.item = None
        return out

    def _text(self, text: str, trace) -> list[dict]:
        out = []
        if self.item is None or self.item["type"] != "message":
            out += self._open(message_item(new_id("msg"), ""))
        self.item["content"][0]["text"] += text
        extra = {"speculative_trace": trace} if trace is not None else {}
        out.append(self._event("response.output_text.delta", item_id=self.item["id"], output_index=len(self.output),
                               content_index=0, delta=text, logprobs=[], **extra,
                               **({"timings": timings(self.job)} if self.timings_per_token else {})))
        return out

    async def events(self) -> AsyncIterator[dict]:
        job, head = self.job, self.head
        start = head.response("in_progress", [])
        yield self._event("response.created", response=start)
        yield self._event("response.in_progress", response=start)
        for progress, times in progress_events(job) if self.progress else ():
            yield self._event("response.in_progress", response=start, prompt_progress=progress,
                              **({"timings": times} if self.timings_per_token else {}))
        held, hold_blank = "", job.req.reads_calls
        async for event in answer_events(job):
            kind = type(event)
            if kind is Text:
                text = event.text
                if self.item is None or self.item["type"] != "message":
                    text, held = held + text, ""
                    if not text or hold_blank and not text.strip():
                        held = text
                        continue
                for e in self._text(text, event.trace) if text else ():
                    yield e
            elif kind is ReasoningText:  # the answer's reasoning block comes first: a reasoning item
                if event.text:
                    if self.item is None or self.item["type"] != "reasoning":
                        for e in self._open(reasoning_item(new_id("rs"), "")):
                            yield e
                    self.item["content"][0]["text"] += event.text
                    extra = {"speculative_trace": event.trace} if event.trace is not None else {}
                    yield self._event("response.reasoning_text.delta", item_id=self.item["id"],
                                      output_index=len(self.output), content_index=0, delta=event.text, **extra)
            elif kind is CallStart:
                held = ""
                for e in self._open(call_item(new_id("fc"), event.id, event.name, "")):
                    yield e
            elif kind is CallArguments:
                self.item["arguments"] += event.text
                yield self._event("response.function_call_arguments.delta", item_id=self.item["id"],
                                  output_index=len(self.output), delta=event.text)
            elif kind is Finish:
                cut = event.cut if event.reason == "length" else None  # an incomplete function_call
                calls = any(i["type"] == "function_call" for i in self.output) or (
                    self.item is not None and self.item["type"] == "function_call")
                if held and not calls and cut is None:  # blank text and no call after it: the answer is that text
                    for e in self._text(held, None):
                        yield e
                if cut is not None:
                    for e in self._open(call_item(new_id("fc"), cut.id, cut.name, "")):
                        yield e
                    if cut.arguments:
                        self.item["arguments"] += cut.arguments
                        yield self._event("response.function_call_arguments.delta", item_id=self.item["id"],
                                          output_index=len(self.output), delta=cut.arguments)
                for e in self._close("incomplete" if event.reason == "length" else "completed"):
                    yield e
                final = head.response("completed", self.output, job, event.reason)
                yield self._event("response.completed" if final["status"] == "completed" else "response.incomplete",
                                  response={**final, **event.detail}, timings=timings(job))
