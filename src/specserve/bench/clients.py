"""`specserve bench --clients 1,4,8`: each configuration under load, beside its own no-speculation rate.

At each client count N, N clients send at once, each its own R requests one after another (the next as the
last one's answer ends). Client i's requests are fixed by the seed and i alone (`client_work`): the same work
for every configuration and at every count, its workloads taken in turn so that each client's work is mixed.
Every request is a streamed llama-server `/completion` with the prompt as token ids, the one body that
llama-server and specserve both take, so every server is sent the same work and timed by the same code:

- aggregate tok/s: completion tokens of all N clients over the wall time from the first send to the last answer;
- per request: the decode rate after the first token, (n - 1) / (last chunk - first chunk); the time to the
  first token from sending; and the time it waited for a slot where the server says so (specserve:
  `speculative.queue_s` in the last event; llama-server does not report it).

Baselines are interleaved: each configuration's no-speculation counterpart (the same specserve server with
`speculative.mode` none, or the endpoint --endpoint-baseline pairs it with) runs at the same client count right
before it, then right after the next configuration, alternating (`interleave`), so the ratio of the two
aggregates is measured within a minute and a drifting machine moves both alike. The rows and tables:
load_report.py.
"""
from __future__ import annotations

import math
import threading
import time
import zlib
from dataclasses import dataclass, field, replace

import httpx

from .endpoint import EndpointError, native_stream

WARMUP_TOKENS = 8


class LoadError(EndpointError):
    """A server answered a load run's request with an error, or not at all."""


@dataclass(frozen=True)
class Request:
    """One request of a client's work: the prompt as token ids and how to sample it."""

    workload: str
    index: int
    tokens: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int


@dataclass(frozen=True)
class LoadTarget:
    """Where a configuration's requests go: a server's base URL, and what the configuration adds to each body
    (specserve: its `speculative` object; an endpoint: nothing, its own mode)."""

    name: str
    url: str
    extra: dict = field(default_factory=dict, hash=False)
    ignore_eos: bool = False

    def body(self, r: Request, scope: str = "") -> dict:
        """scope: the cross-request scope of specserve's store for this run (`run_load`: one per run)."""
        body = {"prompt": list(r.tokens), "n_predict": r.max_tokens, "temperature": r.temperature, "seed": r.seed,
                "stream": True, "cache_prompt": False, **self.extra}  # cold, as the bench's other runs
        if "speculative" in body and scope:
            body["speculative"] = {**body["speculative"], "cross_request_scope": scope}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


def client_work(prompts: dict[str, list[Request]], n_clients: int, per_client: int, seed: int) -> list[list[Request]]:
    """Each client's requests, in order: request j of client i is from workload (i + j) mod W, dealt from that
    workload's prompts shuffled by the seed, in the order of (client, request): client i's work depends on the
    clients before it, never on how many come after, so it is the same whatever N and whatever the configuration;
    no prompt is sent twice in a run until a workload's prompts are all dealt (a repeat is another workload)."""
    import random

    names = [w for w, ps in prompts.items() if ps]
    decks = {}
    for w in names:
        decks[w] = list(prompts[w])
        random.Random(seed * 1_000_003 + zlib.crc32(w.encode())).shuffle(decks[w])
    dealt = dict.fromkeys(names, 0)
    work = []
    for i in range(n_clients):
        work.append([])
        for j in range(per_client):
            w = names[(i + j) % len(names)]
            work[-1].append(decks[w][dealt[w] % len(decks[w])])
            dealt[w] += 1
    return work


def request_seed(seed: int, workload: str, index: int) -> int:
    """A prompt's sampling seed, as the bench's other runs seed it (runner.BenchPlan.sampling)."""
    return (seed * 1_000_003 + zlib.crc32(f"{workload}/{index}".encode())) % 2**31


def interleave(pairs: list[tuple[str, str]], levels: list[int]) -> list[tuple[int, str, str]]:
    """The runs in order, as (clients, what runs, the configuration whose pair it belongs to): at each level,
    each (configuration, baseline) pair back to back, the baseline first for the first pair, last for the
    next, and so on. A pair whose configuration is its own baseline runs once."""
    order, baseline_first = [], True
    for n in levels:
        for config, base in pairs:
            if config == base:
                order.append((n, config, config))
                continue
            runs = (base, config) if baseline_first else (config, base)
            order += [(n, who, config) for who in runs]
            baseline_first = not baseline_first
    return order


def stream_one(client: httpx.Client, target: LoadTarget, r: Request, scope: str = "") -> dict:
    """One streamed /completion: tokens, time to first token, decode rate after it, queue time (or None)."""
    t_first = t_last = t_done = 0.0
    chunks, last = 0, {}
    try:
        for t_done, event in native_stream(client, target.url + "/completion", target.body(r, scope)):
            if event.get("content"):
                t_last = t_done
                t_first = t_first or t_last
                chunks += 1
            if event.get("stop"):
                last = event
    except EndpointError as e:
        raise LoadError(f"{target.name}: {e}") from None
    timings = last.get("timings") or {}
    n = int(last.get("tokens_predicted") or timings.get("predicted_n") or chunks)
    queue = (last.get("speculative") or {}).get("queue_s")
    span = t_last - t_first
    return {"workload": r.workload, "prompt_index": r.index, "n_generated": n, "n_chunks": chunks,
            "ttft_s": round(t_first, 4), "t_done_s": round(t_done, 4),
            "decode_tokens_per_s": round((n - 1) / span, 2) if n > 1 and span > 0 else None,
            "queue_s": None if queue is None else float(queue),
            "n_drafted": int(timings.get("draft_n") or 0), "n_accepted": int(timings.get("draft_n_accepted") or 0)}


def run_level(target: LoadTarget, work: list[list[Request]], scope: str = "", timeout: float = 3600.0,
              transport: httpx.BaseTransport | None = None) -> dict:
    """N clients (one thread each, len(work)) sending their work at once; the level's aggregate and its requests.

    The clients start together at a barrier; the wall time runs from the first send to the last answer."""
    results: list[list[dict]] = [[] for _ in work]
    errors: list[BaseException] = []
    barrier, failed = threading.Barrier(len(work)), threading.Event()
    sent, done = [math.inf] * len(work), [0.0] * len(work)

    def client(i: int) -> None:
        with httpx.Client(timeout=timeout, transport=transport) as c:
            try:
                barrier.wait()
                sent[i] = time.perf_counter()
                for r in work[i]:
                    if failed.is_set():  # another client's request failed: the run is lost, stop sending
                        return
                    results[i].append(stream_one(c, target, r, scope))
                done[i] = time.perf_counter()
            except Exception as e:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(e)
                failed.set()
                barrier.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0] if isinstance(errors[0], LoadError) else LoadError(f"{target.name}: {errors[0]}")
    wall = max(done) - min(sent)
    requests = [{**r, "client": i} for i, rs in enumerate(results) for r in rs]
    tokens = sum(r["n_generated"] for r in requests)
    return {"config": target.name, "clients": len(work), "n_requests": len(requests), "n_generated": tokens,
            "wall_s": round(wall, 6), "aggregate_tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
            "requests": requests}


def run_load(targets: dict[str, LoadTarget], pairs: list[tuple[str, str]], levels: list[int],
             work: dict[int, list[list[Request]]], warm: Request, progress=None,
             transport: httpx.BaseTransport | None = None) -> list[dict]:
    """Every run of `interleave(pairs, levels)`, each a `run_level` record with its place: `pair` (the
    configuration it was run for) and `order` (its position in the run).

    First, one short unmeasured request to each server (`warm`, a prompt no run sends: its first pass's buffers
    and threads kept out of the numbers). Each run has a cross-request scope of its own on specserve's servers:
    its requests draft from each other's answers, as users' do, never from another run's answers to the same
    prompts (a baseline's greedy answers would make the configuration after it a run of repeats)."""
    for name in dict.fromkeys(who for config, base in pairs for who in (base, config)):
        with httpx.Client(timeout=3600.0, transport=transport) as c:
            stream_one(c, targets[name], replace(warm, max_tokens=WARMUP_TOKENS), "bench-clients-warm-up")
    runs = []
    for k, (n, who, pair) in enumerate(interleave(pairs, levels)):
        if progress is not None:
            progress(f"{n} client(s): {who}" + (f" (the baseline of {pair})" if who != pair else ""))
        record = run_level(targets[who], work[n], f"bench-clients-{k}", transport=transport)
        runs.append({**record, "pair": pair, "order": k})
    return runs
