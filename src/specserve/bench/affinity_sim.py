"""Simulated prefix-affinity hit rate against replica count on the multi-turn workload (no model).

    python -m specserve.bench.affinity_sim [--replicas 1,2,4,8,16] [--conversations 80] [--load 0.7]

The multi-turn workload's conversations (question, retry, rename, add docstrings: each later
turn re-sends the earlier ones) arrive at random times; each turn follows the previous one's
answer after a think time. Every request goes to a replica by a policy:
- `affinity`: specserve's router (`cluster.routing.route`: rendezvous home by the request's
  real routing key, the least loaded replica when home has all its slots busy and another not);
- `pow2`: Ray Serve's default (the less loaded of two random replicas);
- `random`.
A request hits when its replica served an earlier turn of the conversation and still holds
it (an LRU of `cache` conversations per replica: slots' KV caches and the suffix store).
A hit runs `hit_speedup` times faster (default 1.65: ngram-mod's repeat vs first request on
the reference pair, 4.02x / 2.43x). Service times are exponential, `slots` requests run at
once per replica, the rest queue. The scaling model on paper: aggregate throughput ~
replicas x single-replica throughput x 1 / (h / hit_speedup + 1 - h), h the hit rate here.
"""
from __future__ import annotations

import argparse
import collections
import heapq
import json
import random
import sys

from ..cluster.routing import rank, route, route_key
from .workloads import load_workload, resolve_messages

POLICIES = ("affinity", "pow2", "random")


def conversations(n: int) -> list[list[str]]:
    """The routing key of each turn of the first n multi-turn conversations (4 turns each)."""
    prompts = load_workload("multi-turn", 4 * n)
    convs: dict[int, list[str]] = collections.defaultdict(list)
    for p in prompts:
        answers = {i: f"(answer {i})" for i in p.answers_needed}
        body = json.dumps({"messages": resolve_messages(p, answers)}).encode()
        convs[p.index // 4].append(route_key("/v1/chat/completions", body))
    return list(convs.values())


def simulate(replicas: int, conversations: int = 80, policy: str = "affinity", slots: int = 2, cache: int = 64,
             load: float = 0.7, hit_speedup: float = 1.65, think_s: float = 2.0, seed: int = 0,
             convs: list[list[str]] | None = None) -> dict:
    """One run; returns hit rate, the share of requests that could hit at all, fallbacks, mean queue wait."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
    rng = random.Random(seed)
    convs = convs if convs is not None else globals()["conversations"](conversations)
    ids = [f"replica-{i}" for i in range(replicas)]
    busy = {r: 0 for r in ids}
    queues: dict[str, collections.deque] = {r: collections.deque() for r in ids}
    lru: dict[str, collections.OrderedDict] = {r: collections.OrderedDict() for r in ids}
    n_turns = sum(len(c) for c in convs)
    # Conversations start as a Poisson stream at the rate that keeps replicas `load` busy (mean service 1 s).
    rate = load * replicas * slots / len(convs[0])
    events, t = [], 0.0
    for c in range(len(convs)):
        t += rng.expovariate(rate)
        heapq.heappush(events, (t, "arrive", c, 0))
    stats = {"hits": 0, "reusable": 0, "fallbacks": 0, "wait": 0.0, "done": 0}

    def start(r: str, now: float, c: int, turn: int, arrived: float) -> None:
        key = convs[c][turn]
        hit = key in lru[r]
        stats["hits"] += hit
        stats["wait"] += now - arrived
        busy[r] += 1
        heapq.heappush(events, (now + rng.expovariate(1.0) / (hit_speedup if hit else 1.0), "finish", c, turn, r))

    while events:
        now, kind, c, turn, *rest = heapq.heappop(events)
        key = convs[c][turn]
        if kind == "arrive":
            stats["reusable"] += turn > 0
            if policy == "affinity":
                tier = route(key, dict(busy), slots)[0]
                r = min(tier, key=lambda x: busy[x])
                stats["fallbacks"] += r != rank(key, ids)[0]
            elif policy == "pow2":
                r = min(rng.sample(ids, min(2, len(ids))), key=lambda x: busy[x])
            else:
                r = rng.choice(ids)
            if busy[r] < slots:
                start(r, now, c, turn, now)
            else:
                queues[r].append((c, turn, now))
        else:
            r = rest[0]
            busy[r] -= 1
            stats["done"] += 1
            lru[r][key] = True
            lru[r].move_to_end(key)
            while len(lru[r]) > cache:
                lru[r].popitem(last=False)
            if queues[r]:
                qc, qturn, arrived = queues[r].popleft()
                start(r, now, qc, qturn, arrived)
            if turn + 1 < len(convs[c]):
                heapq.heappush(events, (now + rng.expovariate(1 / think_s), "arrive", c, turn + 1))
    h = stats["hits"] / n_turns
    return {"replicas": replicas, "policy": policy, "requests": n_turns, "hit_rate": round(h, 4),
            "reusable_share": round(stats["reusable"] / n_turns, 4),
            "fallback_share": round(stats["fallbacks"] / n_turns, 4),
            "mean_wait_s": round(stats["wait"] / n_turns, 3),
            "relative_throughput": round(replicas / (h / hit_speedup + 1 - h), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specserve.bench.affinity_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="1,2,4,8,16", help="comma-separated counts (default 1,2,4,8,16)")
    p.add_argument("--conversations", type=int, default=80, help="multi-turn conversations (default 80, all)")
    p.add_argument("--slots", type=int, default=2, help="requests running at once per replica (default 2)")
    p.add_argument("--cache", type=int, default=64, help="conversations a replica keeps cached (default 64)")
    p.add_argument("--load", type=float, default=0.7, help="offered load per slot, 0-1 (default 0.7)")
    p.add_argument("--hit-speedup", type=float, default=1.65, help="speed of a cache hit vs a miss (default 1.65)")
    p.add_argument("--seeds", type=int, default=5, help="runs averaged per point (default 5)")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = p.parse_args(argv)
    convs = conversations(args.conversations)
    rows = []
    print(f"{'replicas':>8} {'policy':>8} {'hit rate':>8} {'fallback':>8} {'wait s':>7} {'x 1 miss-only replica':>22}")
    for n in (int(x) for x in args.replicas.split(",")):
        for policy in POLICIES:
            runs = [simulate(n, policy=policy, slots=args.slots, cache=args.cache, load=args.load,
                             hit_speedup=args.hit_speedup, seed=s, convs=convs) for s in range(args.seeds)]
            row = {k: (round(sum(r[k] for r in runs) / len(runs), 4) if isinstance(runs[0][k], float) else runs[0][k])
                   for k in runs[0]}
            rows.append(row)
            print(f"{n:>8} {policy:>8} {row['hit_rate']:>8.3f} {row['fallback_share']:>8.3f} "
                  f"{row['mean_wait_s']:>7.2f} {row['relative_throughput']:>22.2f}")
    print(f"(at most {rows[0]['reusable_share']:.2f} of requests can hit: a conversation's first turn never does)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
