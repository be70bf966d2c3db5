"""What to probe, and what each process should answer: read from the Plan, never guessed.

Only node rank 0 of a multi-node instance serves HTTP, so one target stands for the instance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kit.topology.plan import Plan, Role
from kit.topology.schema import SLO, Engine, RouterKind


@dataclass(frozen=True)
class Expected:
    """What the topology says a worker at this port serves."""

    served_model: str
    mode: Role
    engine: Engine
    sglang_version: str
    bootstrap_port: int | None
    tp_size: int | None


@dataclass(frozen=True)
class WorkerTarget:
    """One instance's HTTP endpoint (its node rank 0)."""

    name: str
    role: Role
    instance: int
    host: str
    url: str
    nnodes: int
    expected: Expected

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
class Targets:
    """Everything one status round probes."""

    deployment: str
    workers: tuple[WorkerTarget, ...]
    router: RouterTarget
    slo: SLO


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _router_api_key(env_name: str | None, file: str | None) -> str | None:
    """The client API key from the control machine (env var or file), if it is there."""
    if env_name:
        return os.environ.get(env_name, "").strip() or None
    if file:
        try:
            return Path(file).expanduser().read_text().strip() or None
        except OSError:
            return None
    return None


def targets_from_plan(plan: Plan) -> Targets:
    """The probe targets of a Plan: rank-0 workers in start order, then the router."""
    workers = []
    for w in plan.workers:
        if not w.serves_http:
            continue
        tp = _flag_value(w.command.args, "--tp-size")
        workers.append(
            WorkerTarget(
                name=f"{w.role}-{w.instance}",
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
                    tp_size=int(tp) if tp and tp.isdigit() else None,
                ),
            )
        )
    router = plan.router
    metrics_url = router.metrics_url
    return Targets(
        deployment=plan.name,
        workers=tuple(workers),
        router=RouterTarget(
            name=router.name,
            kind=router.kind,
            host=router.host,
            url=router.url,
            metrics_url=metrics_url,
            api_key=_router_api_key(router.api_key_env, router.api_key_file),
        ),
        slo=plan.slo,
    )
