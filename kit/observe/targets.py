"""What to probe, and what each process should answer: read from the Plan, never guessed.

Node rank 0 of an instance serves its API; the other nodes of a multi-node instance serve
`/health` and `/metrics` on their own `--port` (SGLang 0.5.23's dummy health server,
`utils/common.py` launch_dummy_health_check_server), so each is a target too (`node_rank` > 0),
probed for those two only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.topology.plan_types import Plan, Role
from kit.topology.schema import SLO, Engine, RouterKind


@dataclass(frozen=True)
class Expected:
    """What the topology says a worker at this port serves."""

    served_model: str
    mode: Role
    engine: Engine
    sglang_version: str
    bootstrap_port: int | None
    tp_size: int


@dataclass(frozen=True)
class WorkerTarget:
    """One worker process's HTTP endpoint: an instance's node rank 0 (named as the instance),
    or another node of a multi-node instance (named as its process, `prefill-0-node1`)."""

    name: str
    role: Role
    instance: int
    host: str
    url: str
    nnodes: int
    expected: Expected
    node_rank: int = 0

    @property
    def follower(self) -> bool:
        """A node rank >= 1: it serves only /health and /metrics."""
        return self.node_rank > 0

    @property
    def endpoint(self) -> str:
        """host:port as typed in a browser or curl (IPv6 in brackets)."""
        return self.url.removeprefix("http://")


@dataclass(frozen=True)
class RouterTarget:
    """The load balancer: its client port and, for smg, its separate Prometheus port."""

    name: str
    kind: RouterKind
    host: str
    url: str
    metrics_url: str
    api_key: str | None


@dataclass(frozen=True)
class KvPoolTarget:
    """The KV pool master's HTTP endpoint (/health, /metrics)."""

    name: str
    host: str
    url: str

    @property
    def endpoint(self) -> str:
        return self.url.removeprefix("http://")


@dataclass(frozen=True)
class ReplicaTarget:
    """One router replica (router.hosts): its host, URL there, and its log file there."""

    host: str
    url: str
    log_path: str


@dataclass(frozen=True)
class Targets:
    """Everything one status round probes: with router.hosts each replica (the first too)
    and, with router.vip, the VIP's URL."""

    deployment: str
    workers: tuple[WorkerTarget, ...]
    router: RouterTarget
    slo: SLO
    kv_pool: KvPoolTarget | None = None
    replicas: tuple[ReplicaTarget, ...] = ()
    vip_url: str | None = None


def targets_from_plan(plan: Plan) -> Targets:
    """The probe targets of a Plan: every worker process in start order (an instance's rank 0,
    then its other nodes), then the router. Raises `SecretError` when the topology names a
    router key this machine cannot read."""
    workers = []
    for w in plan.workers:
        workers.append(
            WorkerTarget(
                name=w.instance_name if w.serves_http else w.name,
                role=w.role,
                instance=w.instance,
                host=w.host,
                url=w.url,
                nnodes=w.nnodes,
                expected=Expected(
                    served_model=plan.model.served_name,
                    mode=w.role,
                    engine=plan.engine,
                    sglang_version=plan.sglang_version,
                    bootstrap_port=w.bootstrap_port if w.role == "prefill" else None,
                    tp_size=w.parallelism.tp,
                ),
                node_rank=w.node_rank,
            )
        )
    router = plan.router
    return Targets(
        deployment=plan.name,
        workers=tuple(workers),
        router=RouterTarget(
            name=router.name,
            kind=router.kind,
            host=router.host,
            url=router.url,
            metrics_url=router.metrics_url,
            api_key=router.api_key(),
        ),
        slo=plan.slo,
        kv_pool=(
            KvPoolTarget(plan.kv_pool.name, plan.kv_pool.host, plan.kv_pool.url)
            if plan.kv_pool
            else None
        ),
        replicas=tuple(
            ReplicaTarget(host, plan.router_url_on(host), router.log_path)
            for host in plan.router_hosts
        ),
        vip_url=plan.vip_url,
    )
