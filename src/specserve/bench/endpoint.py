"""Benchmark any OpenAI-compatible server (llama-server, vLLM, `specserve serve`) over HTTP.

Each prompt is one streaming chat completion, asked cold (`cache_prompt: false`, as the bench's own
runs). Time to first token is the time to the first chunk carrying content. Decode speed follows vLLM's
benchmark (time per output token after the first): (tokens - 1) / (time of the last content chunk - time
of the first): it leaves out what came before the first token, a draft model's prompt among it, which the
bench's own runs count; the time to the last content chunk (`t_last_token_s`), from sending the request, is
timed as theirs and is what the report's `e2e` pairs. Tokens are counted from `usage.completion_tokens`
when the server sends it (we ask with stream_options.include_usage); otherwise each content chunk counts as
one token, which undercounts servers that send several tokens per chunk. Draft counts come from
`usage.speculative` (specserve) or `timings.draft_n`/`draft_n_accepted` (llama-server) when the server
reports them.
"""
from __future__ import annotations

import json
import time

import httpx


class EndpointError(RuntimeError):
    """The server could not be reached or answered with an error (status: its HTTP status, if any)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class EndpointClient:
    """One OpenAI-compatible server, addressed by its base URL (with or without /v1)."""

    def __init__(self, url: str, timeout: float = 600.0, model: str | None = None, api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None):
        """transport: what carries the requests (httpx's own by default; an httpx.MockTransport answers in place
        of a server)."""
        base = url.rstrip("/")
        self.url = url
        self.base = base if base.endswith("/v1") else base + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self._model = model
        self._usage_supported = True

    def probe(self) -> None:
        """Fail early, before any local run, when the server cannot be reached at all."""
        try:
            self._client.get(f"{self.base}/models", timeout=10)
        except httpx.TransportError as e:
            raise EndpointError(f"{self.url}: cannot connect ({e})") from None

    @property
    def model(self) -> str:
        """The model to ask for: the first one the server lists (servers with one model ignore it)."""
        if self._model is None:
            try:
                r = self._client.get(f"{self.base}/models")
                r.raise_for_status()
                data = r.json().get("data") or [{}]
                self._model = str(data[0].get("id", "default"))
            except (httpx.HTTPError, ValueError, AttributeError):
                self._model = "default"
        return self._model

    def generate(self, messages: list[dict], max_tokens: int, temperature: float, seed: int | None,
                 ignore_eos: bool = False, schema: dict | None = None) -> dict:
        """Stream one chat completion; return its timing in the shape of GenerationStats.as_dict(), and
        under "text" what it answered. schema: constrain it (OpenAI's response_format, which llama-server,
        vLLM and specserve take)."""
        body = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens,
                "temperature": temperature, "stream": True,
                "cache_prompt": False}  # cold, as the bench's own runs (llama-server's field; others ignore it)
        if seed is not None:
            body["seed"] = seed
        if schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        if ignore_eos:
            body["ignore_eos"] = True  # llama-server, vLLM and specserve accept it; others ignore it
        if self._usage_supported:
            body["stream_options"] = {"include_usage": True}
        try:
            return self._stream(body)
        except EndpointError as e:
            if "stream_options" not in body or e.status not in (400, 422):
                raise
            self._usage_supported = False  # some servers reject stream_options: count chunks instead
            del body["stream_options"]
            return self._stream(body)

    def _stream(self, body: dict) -> dict:
        t0 = time.perf_counter()
        t_first = t_last = 0.0
        n_chunks, usage, timings, finish, parts = 0, None, None, "", []
        try:
            with self._client.stream("POST", f"{self.base}/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise EndpointError(f"{self.url}: HTTP {r.status_code}: {r.text[:200]}", r.status_code)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    usage = event.get("usage") or usage
                    timings = event.get("timings") or timings
                    for choice in event.get("choices") or []:
                        finish = choice.get("finish_reason") or finish
                        if (choice.get("delta") or {}).get("content"):
                            parts.append(choice["delta"]["content"])
                            t_last = time.perf_counter() - t0
                            t_first = t_first or t_last
                            n_chunks += 1
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            raise EndpointError(f"{self.url}: {e}") from None
        t_total = time.perf_counter() - t0
        n_tokens = int(usage.get("completion_tokens", n_chunks)) if usage else n_chunks
        span = t_last - t_first
        tokens_per_s = (n_tokens - 1) / span if n_tokens > 1 and span > 0 else 0.0
        return {"n_prompt": int(usage.get("prompt_tokens", 0)) if usage else 0, "n_generated": n_tokens,
                "n_chunks": n_chunks, "tokens_counted_from": "usage" if usage else "chunks",
                "tokens_per_s": round(tokens_per_s, 2), "decode_tokens_per_s": round(tokens_per_s, 2),
                "time_to_first_token_s": round(t_first, 4), "t_last_token_s": round(t_last, 4),
                "t_total_s": round(t_total, 4), "finish_reason": finish, "text": "".join(parts),
                **_draft_counts(usage, timings)}

    def close(self) -> None:
        self._client.close()


def _draft_counts(usage: dict | None, timings: dict | None) -> dict:
    """Drafted/accepted tokens (and target passes) as the server reports them, if it does."""
    spec = (usage or {}).get("speculative")
    if isinstance(spec, dict) and "drafted" in spec:
        return {"n_drafted": int(spec["drafted"]), "n_accepted": int(spec.get("accepted", 0)),
                "n_passes": int(spec.get("passes", 0)), "drafter_steps": dict(spec.get("drafter_steps") or {})}
    if isinstance(timings, dict) and "draft_n" in timings:
        return {"n_drafted": int(timings["draft_n"]), "n_accepted": int(timings.get("draft_n_accepted", 0))}
    return {}


def infill_url(url: str) -> str:
    """llama-server's /infill (and specserve's) on the server at `url` (with or without /v1)."""
    base = url.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base) + "/infill"


def native_stream(client: httpx.Client, url: str, body: dict):
    """(seconds since the request, event) for each event of one streamed request: llama-server's native
    /completion and /infill (`data:` objects, the last with "stop": true), or an OpenAI-style
    /v1/completions (up to `data: [DONE]`, which is not an event). A kept-alive connection the server had closed
    before anything came back (llama-server drops idle ones after 5 s) was not served: it is sent once more,
    timed afresh. Any other failure, and a stream cut part-way, raise EndpointError."""
    for attempt in (0, 1):
        t0, seen = time.perf_counter(), False
        try:
            with client.stream("POST", url, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise EndpointError(f"{url}: HTTP {r.status_code}: {r.text[:300]}", r.status_code)
                for line in r.iter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise EndpointError(f"{url}: {event['error']}")
                    seen = True
                    yield time.perf_counter() - t0, event
            return
        except httpx.HTTPError as e:
            if seen:
                raise EndpointError(f"{url}: the server closed the stream part-way ({e})") from None
            if attempt or not isinstance(e, httpx.RemoteProtocolError):
                raise EndpointError(f"{url}: {e}") from None
        except json.JSONDecodeError as e:
            raise EndpointError(f"{url}: {e}") from None


def stream_infill(client: httpx.Client, url: str, body: dict) -> dict:
    """One streamed /infill request. Returns the text, the time to the first chunk with text and to the
    last event, and what the server reported: tokens predicted, evaluated and cached, drafts."""
    t_first = t_last = 0.0
    parts, last = [], {}
    for t_last, event in native_stream(client, url, {**body, "stream": True}):
        if event.get("content"):
            parts.append(event["content"])
            t_first = t_first or t_last
        if event.get("stop"):
            last = event
    timings = last.get("timings") or {}
    return {"text": "".join(parts), "t_first_s": t_first, "t_total_s": t_last,
            "n_generated": int(last.get("tokens_predicted", timings.get("predicted_n", 0)) or 0),
            "prompt_n": int(timings.get("prompt_n", 0) or 0), "cache_n": int(timings.get("cache_n", 0) or 0),
            "n_drafted": int(timings.get("draft_n", 0) or 0),
            "n_accepted": int(timings.get("draft_n_accepted", 0) or 0),
            "t_prompt_s": float(timings.get("prompt_ms", 0.0) or 0.0) / 1000}
