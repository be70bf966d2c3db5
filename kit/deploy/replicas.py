"""Router replicas (router.hosts): the order in which `pdkit up` changes them, one at a time,
so that the VIP (or a site's own balancer) always has a live router.

1. `rollout_order`: the backups first, the first host (VRRP's highest priority, the one that
   holds the VIP while it is healthy, and the one pdkit talks to) last, so that a setting
   that keeps the router from starting shows on a replica that serves nobody.
2. For each, in turn (`kit.deploy.live.LiveChange`): deploy.yml --tags router on that host
   alone (pdkit's router handed over on SIGUSR2, smg restarted), then the gate: a new image
   answering on that host (pdkit's: /health's `started` later than before) and its
   /readiness; only then the next. A replica that fails the gate stops the rollout: the ones
   not reached yet still run the settings they had.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.topology.plan_types import Plan


@dataclass(frozen=True, slots=True)
class ReplicaStep:
    """One replica's turn: its host, the URL pdkit checks it at, its place in the order."""

    host: str
    url: str
    index: int
    count: int

    def line(self, action: str) -> str:
        return f"replica {self.index}/{self.count} on {self.host} ({self.url}): {action}"


def rollout_order(plan: Plan) -> list[ReplicaStep]:
    """The router's replicas in the order `pdkit up` changes them (the module doc)."""
    first = plan.router.host
    hosts = [h for h in plan.router_replicas if h != first] + [first]
    return [
        ReplicaStep(host, plan.router_url_on(host), i, len(hosts))
        for i, host in enumerate(hosts, 1)
    ]
