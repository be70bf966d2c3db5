"""Wait until processes are ready: poll their HTTP health from the control machine (and the
service manager's view of them: supervisord on local hosts, `systemctl show` of their units on
systemd hosts, every poll) until all are ready, one fails, or the timeout passes. The judging
is `kit.deploy.readiness`; this module only polls and times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kit.deploy.readiness import (
    HttpAnswer,
    ServiceInfo,
    Verdict,
    evaluate,
    follow_rank0,
    timed_out,
)
from kit.deploy.services import host_processes
from kit.hosts.inventory import DeployHost
from kit.observe.probe import Prober
from kit.topology.plan_types import Plan

POLL_INTERVAL_S = 0.5
REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Target:
    """A process to wait for. `url` is None for a node that serves no HTTP (rank > 0); such a
    node follows `rank0`, the name of its instance's rank-0 process."""

    name: str
    role: str
    host: str
    url: str | None
    ready_path: str
    rank0: str | None = None
    unit: str | None = None
    """Its systemd unit: on systemd hosts each poll also reads `systemctl show` of it."""
    process: str | None = None
    """Its process's name where `name` differs (a router replica past the first: `router@b`)."""

    @property
    def process_name(self) -> str:
        return self.process or self.name


@dataclass(frozen=True)
class ProcessStatus:
    """A target's latest verdict; `elapsed` is seconds from the start of the wait until it was
    settled, or until now. `pid` is known where supervisord could be asked."""

    target: Target
    verdict: Verdict
    elapsed: float
    pid: int | None = None


def worker_targets(plan: Plan) -> list[Target]:
    """Every worker process, in plan order; rank > 0 nodes follow their rank 0."""
    rank0 = {w.instance_name: w.name for w in plan.workers if w.serves_http}
    return [
        Target(
            name=w.name,
            role=w.role,
            host=w.host,
            url=w.url if w.serves_http else None,
            ready_path="/health",
            rank0=None if w.serves_http else rank0[w.instance_name],
            unit=w.unit,
        )
        for w in plan.workers
    ]


def router_targets(plan: Plan, hosts: Sequence[str] | None = None) -> list[Target]:
    """The router on each of its hosts (router.hosts: every replica; or those of `hosts`),
    ready when /readiness answers 200."""
    router = plan.router
    return [
        Target(
            replica_name(plan, host),
            "router",
            host,
            plan.router_url_on(host),
            "/readiness",
            unit=router.unit,
            process=router.name,
        )
        for host in plan.router_replicas
        if hosts is None or host in hosts
    ]


def vip_targets(plan: Plan) -> list[Target]:
    """The router's VIP (router.vip), ready when its /health answers 200 (keepalived holds it
    where a router answers); none without a VIP."""
    if plan.vip_url is None:
        return []
    router = plan.router
    vip = Target("router VIP", "router", router.host, plan.vip_url, "/health", process=router.name)
    return [vip]


def replica_name(plan: Plan, host: str) -> str:
    """How the router on `host` is named in tables: the router's name on its first host,
    `router@HOST` on a later replica's."""
    return plan.router.name if host == plan.router.host else f"{plan.router.name}@{host}"


def monitoring_targets(plan: Plan) -> list[Target]:
    """Prometheus (topology `monitoring:`), ready when /-/ready answers 200; none without it."""
    m = plan.monitoring
    return [Target(m.name, "monitoring", m.host, m.url, "/-/ready", unit=m.unit)] if m else []


def kv_pool_targets(plan: Plan) -> list[Target]:
    """The KV pool's master (topology `kv_pool:`), ready when its /health answers 200."""
    k = plan.kv_pool
    return [Target(k.name, "kv_pool", k.host, k.url, "/health")] if k else []


async def _get(prober: Prober, url: str, headers: Mapping[str, str] | None) -> HttpAnswer:
    fetched = await prober.get(url, dict(headers) if headers else None)
    return HttpAnswer(fetched.status, fetched.detail or None)


async def _services(
    hosts: Sequence[DeployHost], targets: Sequence[Target]
) -> dict[str, ServiceInfo]:
    """The service managers' view of `targets` (supervisord on local hosts, `systemctl show`
    of their units on systemd hosts), read from every host at once."""
    units = {
        h.name: {t.unit: t.process_name for t in targets if t.host == h.name and t.unit}
        for h in hosts
    }
    found: dict[str, ServiceInfo] = {}
    views = await asyncio.gather(
        *(asyncio.to_thread(host_processes, h, units[h.name]) for h in hosts)
    )
    for host, view in zip(hosts, views, strict=True):
        mine = {t.process_name: t.name for t in targets if t.host == host.name}
        for name, info in (view or {}).items():
            if name in mine:
                found[mine[name]] = info
    return found


async def wait_ready(
    targets: Sequence[Target],
    hosts: Mapping[str, DeployHost],
    *,
    timeout: float,
    since: float,
    headers: Mapping[str, str] | None = None,
    on_update: Callable[[list[ProcessStatus]], None] | None = None,
    interval: float = POLL_INTERVAL_S,
) -> list[ProcessStatus]:
    """Poll until every target is ready, one has failed, or `timeout` seconds have passed.

    `since` (epoch seconds) is when the rollout finished: a supervisord process that stopped
    after it has crashed. Returns the last status of every target, in order.
    """
    started = time.monotonic()
    probe_hosts = [hosts[name] for name in sorted({t.host for t in targets}) if name in hosts]
    settled: dict[str, ProcessStatus] = {}
    async with Prober(timeout=REQUEST_TIMEOUT_S) as prober:
        while True:
            services = await _services(probe_hosts, targets)
            pending = [t for t in targets if t.url and t.name not in settled]
            answers = dict(
                zip(
                    [t.name for t in pending],
                    await asyncio.gather(
                        *(_get(prober, f"{t.url}{t.ready_path}", headers) for t in pending)
                    ),
                    strict=True,
                )
            )
            elapsed = time.monotonic() - started
            statuses = _round(
                targets, answers, services, settled, elapsed=elapsed, since=since, timeout=timeout
            )
            if on_update is not None:
                on_update(statuses)
            if all(s.verdict.done for s in statuses) or any(
                s.verdict.state in ("failed", "timeout") for s in statuses
            ):
                return statuses
            await asyncio.sleep(interval)


def _round(
    targets: Sequence[Target],
    answers: Mapping[str, HttpAnswer],
    services: Mapping[str, ServiceInfo],
    settled: dict[str, ProcessStatus],
    *,
    elapsed: float,
    since: float,
    timeout: float,
) -> list[ProcessStatus]:
    """One round's statuses; a ready target stays ready unless its service fails."""
    by_name: dict[str, ProcessStatus] = {}
    for target in targets:
        service = services.get(target.name)
        pid = service.pid if service and service.pid else None
        previous = settled.get(target.name)
        if previous is not None:
            verdict = evaluate(HttpAnswer(200), service, ready_path=target.ready_path, since=since)
            by_name[target.name] = replace(previous, verdict=verdict, pid=pid or previous.pid)
            continue
        answer = answers.get(target.name) if target.url else None
        verdict = evaluate(answer, service, ready_path=target.ready_path, since=since)
        by_name[target.name] = ProcessStatus(target, verdict, elapsed, pid)
    for target in targets:
        status = by_name[target.name]
        if target.rank0 is not None and target.name not in settled:
            status = replace(
                status, verdict=follow_rank0(status.verdict, by_name[target.rank0].verdict)
            )
        status = replace(status, verdict=timed_out(status.verdict, elapsed, timeout))
        if status.verdict.state == "ready" and target.name not in settled:
            settled[target.name] = status
        by_name[target.name] = status
    return [by_name[t.name] for t in targets]
