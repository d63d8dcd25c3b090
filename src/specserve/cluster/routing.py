"""Prefix affinity: which replica a request should go to, as pure functions.

A replica's caches (its slots' KV caches and the suffix store of earlier requests) pay only
when the next request sharing a prefix lands on the same replica. The ingress reduces a
request to a routing key, a hash of the part of the prompt that a conversation keeps
re-sending (system message and first user message; for a raw prompt, its first
`PREFIX_CHARS` characters; for /infill, those of `input_prefix`, the file above the cursor, since
its `prompt` is the line being typed and changes at every keystroke). Replicas are ranked for that
key by rendezvous hashing (highest random weight): every router, in every ingress replica, ranks the
same way without shared state, and when a replica joins or leaves only the keys it owned move. The
first replica in the ranking is the key's home; `route` leaves home for the least loaded replica
only when home is overloaded and another replica has a free slot.
"""
from __future__ import annotations

import hashlib
import json
from typing import Hashable, Sequence

PREFIX_CHARS = 2048  # of a raw prompt; enough to tell apart conversations that share a system prompt


def route_key(path: str, body: bytes, prefix_chars: int = PREFIX_CHARS) -> str:
    """The routing key of a request: a hex digest of its stable prefix ('' when the body has none,
    e.g. not JSON: such a request goes to the least loaded replica)."""
    try:
        obj = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(obj, dict):
        return ""
    model = obj.get("model") if isinstance(obj.get("model"), str) else ""
    messages = obj.get("messages")
    if isinstance(messages, list) and messages:
        head = []
        for m in messages:  # system/developer messages, then the first user message
            head.append(m)
            if isinstance(m, dict) and m.get("role") == "user":
                break
        stable = json.dumps(head, sort_keys=True, ensure_ascii=False)[:prefix_chars]
    elif isinstance(obj.get("input_prefix"), str):  # /infill: the same file, keystroke after keystroke
        stable = "infill\0" + obj["input_prefix"][:prefix_chars]
    elif "prompt" in obj:
        p = obj["prompt"]
        stable = p[:prefix_chars] if isinstance(p, str) else json.dumps(p)[:prefix_chars]
    else:
        return ""
    return hashlib.blake2b(f"{model}\0{stable}".encode(), digest_size=8).hexdigest()


def rank(key: str, replica_ids: Sequence[Hashable]) -> list:
    """Replica ids by rendezvous weight for `key`, the home replica first."""
    def weight(rid) -> bytes:
        return hashlib.blake2b(f"{key}\0{rid}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)


def route(key: str, loads: dict, overload: int) -> list[list]:
    """Replica ids in tiers of preference for a request with `key`.

    loads: replica id -> requests in flight on it (None: unknown, treated as idle).
    overload: in-flight requests at which home is overloaded, normally its slot count
    (more would wait in its queue). Home comes first unless it is overloaded while another
    replica has fewer than `overload` in flight; then those less loaded replicas come first
    and home after them. Without a key every replica is one tier (the least loaded wins).
    """
    ids = list(loads)
    if not ids:
        return []
    if not key:
        return [ids]
    home, *rest = rank(key, ids)

    def load(rid) -> int:
        return loads[rid] or 0

    spare = sorted((r for r in rest if load(r) < overload), key=load)
    if load(home) >= overload and spare:
        return [spare, [home], [r for r in rest if r not in spare]]
    return [[home], sorted(rest, key=load)] if rest else [[home]]
