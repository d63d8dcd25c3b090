"""The engine deployment's request router on Ray Serve's router API: prefix affinity with a
fallback when the home replica is overloaded (the ranking itself is `routing.route`).

Every handle to the engine deployment (one per ingress replica) builds one of these. The
routing key is the first positional argument of each call (the ingress passes it); loads
are the router's cached in-flight counts, which Ray updates on every send and probe.
Among the replicas of one tier Ray picks the least loaded that is not full
(max_ongoing_requests); a tier with none is passed over for the next.
"""
from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .routing import route


class PrefixAffinityRouter(RequestRouter):
    """Home replica by rendezvous hash of the routing key; the least loaded one when home is overloaded."""

    def initialize_state(self, overload: int = 2) -> None:
        """overload: requests in flight at which a replica counts as overloaded (its slot count)."""
        self.overload = max(1, int(overload))

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        key = ""
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every tier below covers all replicas
            if pending_request.args and isinstance(pending_request.args[0], str):
                key = pending_request.args[0]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(r.replica_id) for rid, r in by_id.items()}
        return [[by_id[rid] for rid in tier] for tier in route(key, loads, self.overload)]
