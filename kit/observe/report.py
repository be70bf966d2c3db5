"""One probe round -> one Report: every worker, the router, and what is wrong. Pure.

Beyond each process on its own, the report compares the router's view with the probes, because
that is where PD deployments fail quietly: a prefill still loading while the router says ready,
a worker the router never registered, a healthy worker the router ejected, a router that routes
to something the topology does not have.

`problems` decide `pdkit health`'s exit status; `warnings` (KV transfer failures, SLO misses,
metrics switched off) are shown but do not fail it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kit.observe.kvpool import KvPoolStatus, evaluate_kv_pool
from kit.observe.probe import Round, WorkerAnswers
from kit.observe.replicas import ReplicaStatus, VipStatus, evaluate_replicas
from kit.observe.router import RoutedWorker, RouterStatus, evaluate_router
from kit.observe.targets import Targets
from kit.observe.worker import WorkerStatus, evaluate_worker


@dataclass(frozen=True)
class Finding:
    """One line of `pdkit health`: which process, where, and the cause."""

    process: str
    endpoint: str
    cause: str

    def __str__(self) -> str:
        return f"{self.process} ({self.endpoint}): {self.cause}"


@dataclass(frozen=True)
class Report:
    """The state of a deployment at `taken_at` (wall-clock seconds), probed in `probe_s`
    seconds with `timeout_s` per request."""

    deployment: str
    taken_at: float
    probe_s: float
    timeout_s: float
    workers: tuple[WorkerStatus, ...]
    router: RouterStatus
    problems: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    kv_pool: KvPoolStatus | None = None
    replicas: tuple[ReplicaStatus, ...] = ()
    """Each router replica (router.hosts; empty with one router)."""
    vip: VipStatus | None = None

    @property
    def healthy(self) -> bool:
        return not self.problems


def url_key(url: str) -> str:
    """Compare URLs the way the router writes them: no scheme case, no trailing slash."""
    return url.strip().rstrip("/").lower()


def _with_router_view(
    worker: WorkerStatus, url: str, seen: dict[str, RoutedWorker] | None, router: RouterStatus
) -> tuple[WorkerStatus, list[str]]:
    """The worker's status and problems once the router's view of it is known."""
    problems = list(worker.problems)
    if seen is None or router.state == "down":
        return worker, problems
    view = seen.get(url_key(url))
    if view is None:
        problems.append(f"the {router.kind} router does not list it (never registered?)")
        return worker, problems
    if view.state == "draining":
        cause = "the router is draining it: no new requests"
        return dataclasses.replace(worker, state="draining", cause=worker.cause or cause), [
            *problems,
            cause,
        ]
    if worker.healthy and view.state == "pending":
        cause = "joining: the router routes to it after its first good health probe"
        return dataclasses.replace(worker, state="joining", cause=worker.cause or cause), problems
    if worker.healthy and not view.healthy:
        reason = f": {view.reason}" if view.reason else ""
        problems.append(f"healthy, but the router does not route to it ({view.state}{reason})")
    elif not worker.healthy and view.healthy and problems:
        problems[0] += "; the router still routes to it"
    return worker, problems


def build_report(
    targets: Targets,
    now: Round,
    earlier: Round | None = None,
    *,
    timeout_s: float,
    latency_over_window: bool = False,
) -> Report:
    """Evaluate one round; `earlier` (the previous round in `--watch`) gives rates and windows."""
    earlier_workers: dict[str, WorkerAnswers] = (
        {a.target.url: a for a in earlier.workers} if earlier is not None else {}
    )
    router_before = now.router_metrics_before
    if router_before is None and earlier is not None:
        router_before = earlier.router.metrics
    router = evaluate_router(
        now.router, targets.slo, router_before, latency_over_window=latency_over_window
    )
    seen = {url_key(w.url): w for w in router.workers} if router.workers is not None else None

    workers: list[WorkerStatus] = []
    problems: list[Finding] = []
    warnings: list[Finding] = []
    for answers in now.workers:
        status = evaluate_worker(answers, now.taken_at, earlier_workers.get(answers.target.url))
        if answers.target.follower:  # the router routes to the instance's rank 0 only
            worker_problems = list(status.problems)
        else:
            status, worker_problems = _with_router_view(status, answers.target.url, seen, router)
        workers.append(dataclasses.replace(status, problems=tuple(worker_problems)))
        problems += [Finding(status.name, status.endpoint, p) for p in worker_problems]
        warnings += [Finding(status.name, status.endpoint, w) for w in _worker_warnings(status)]

    where = router.endpoint
    problems += [Finding("router", where, p) for p in router.problems]
    warnings += [Finding("router", where, n) for n in router.notes]
    if seen is not None:
        planned = {url_key(a.target.url) for a in now.workers if not a.target.follower}
        for key, view in sorted(seen.items()):
            if key not in planned:
                what = (
                    f"drains {view.url} ({view.role}), which leaves: it is not in the topology"
                    if view.state == "draining"
                    else f"routes to {view.url} ({view.role}), which is not in the topology"
                )
                warnings.append(Finding("router", where, what))
    if router.slo_met is False:
        warnings.append(Finding("router", where, _slo_miss(router)))
    pool = evaluate_kv_pool(now.kv_pool) if now.kv_pool is not None else None
    if pool is not None and pool.state == "down":
        problems.append(Finding(pool.name, pool.endpoint, pool.cause))
    log_path = targets.replicas[0].log_path if targets.replicas else ""
    replicas = evaluate_replicas(now.replicas, now.vip, targets.vip_url, log_path)
    problems += [Finding(*p) for p in replicas.problems]
    return Report(
        deployment=targets.deployment,
        taken_at=now.taken_at,
        probe_s=now.seconds,
        timeout_s=timeout_s,
        workers=tuple(workers),
        router=router,
        problems=tuple(problems),
        warnings=tuple(warnings),
        kv_pool=pool,
        replicas=replicas.replicas,
        vip=replicas.vip,
    )


def _worker_warnings(status: WorkerStatus) -> list[str]:
    found = list(status.notes)
    kv = status.kv
    failed = [
        f"{count} {what}"
        for count, what in (
            (kv.failed, "KV transfer(s) failed"),
            (kv.bootstrap_failed, "bootstrap(s) failed"),
        )
        if count
    ]
    if failed:
        found.append(", ".join(failed) + " since it started")
    return found


def _slo_miss(router: RouterStatus) -> str:
    parts = []
    for label, lat in (("TTFT", router.ttft), ("TPOT", router.tpot)):
        if lat is not None and lat.within is not None and lat.within < router.slo_attainment:
            parts.append(f"{lat.within:.0%} of {label} <= {lat.limit_ms:g} ms")
    target = f"{router.slo_attainment:.0%}"
    return f"below the SLO ({router.latency_window}): {', '.join(parts)}; target {target}"


def report_to_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON data (what `--json` prints)."""
    data = dataclasses.asdict(report)
    data["healthy"] = report.healthy
    if report.kv_pool is not None:
        pool = report.kv_pool
        data["kv_pool"] |= {"free_bytes": pool.free_bytes, "misses": pool.misses}
    data["problems"] = [dict(dataclasses.asdict(f), line=str(f)) for f in report.problems]
    data["warnings"] = [dict(dataclasses.asdict(f), line=str(f)) for f in report.warnings]
    return data
