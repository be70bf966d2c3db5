"""`pdkit restart` of a `launcher: slurm` deployment: one instance at a time, a new job step.

For each selected instance:
1. The router takes its rank-0 URL out of routing and waits for its requests to finish (a
   role's only instance: listed as returning, its role's requests held for the router's hold).
2. Its step is cancelled (`scancel JOB.STEP`: every node rank with it); the job's loop starts
   it again as a new step on the same nodes, GPUs and ports.
3. pdkit waits for the new step and for its /health (the same readiness gate as `up`), gives
   it back to the router and waits until the router routes to it.
Then the KV transfer gate over the whole deployment. `router` restarts the router's step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console

from kit.deploy.gate import transfer_gate
from kit.deploy.routing import RouterAdmin
from kit.deploy.steps import (
    DRAIN_TIMEOUT_S,
    ROUTER_TIMEOUT_S,
    WORKER_TIMEOUT_S,
    UpOptions,
    raise_unless_ready,
    router_key,
    wait_until_ready,
)
from kit.deploy.wait import router_targets, worker_targets
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.slurm import jobs
from kit.slurm.launcher import load_job
from kit.topology.plan_types import Plan, WorkerProcess

NEW_STEP_TIMEOUT_S = 30.0


def restart(
    topology: Path,
    plan: Plan,
    console: Console,
    options: UpOptions,
    *,
    selector: str | None,
    state_base: Path | None,
) -> None:
    """Restart the selected instances (default: every worker's) one at a time, each as a new
    step of the deployment's job, gated before it rejoins the router."""
    record = load_job(plan)
    state = jobs.job_state(record.job_id) if record is not None else None
    if record is None or state is None or state.state != "RUNNING":
        raise DeployError(
            f"deployment {plan.name} has no running Slurm job, so there is nothing to restart. "
            f"To fix: `pdkit up {topology}`."
        )
    ctx = DeployContext.build(plan, topology, state_base)
    names = ctx.select_processes(selector) if selector else [w.name for w in plan.workers]
    by_process = {w.name: w.instance_name for w in plan.workers}
    by_process[plan.router.name] = plan.router.name
    instances: list[str] = []
    for name in names:
        instance = by_process.get(name)
        if instance is None:
            raise DeployError(
                f"{name} does not run as a Slurm step; restart a worker or the router."
            )
        if instance not in instances:
            instances.append(instance)
    for instance in instances:
        if instance == plan.router.name:
            _restart_router(ctx, console, options, record.job_id)
        else:
            _restart_instance(ctx, console, options, record.job_id, instance)
    if options.gate:
        transfer_gate(ctx, console, options.gate_options)
    console.print(f"Restarted {', '.join(instances)} as new steps of job {record.job_id}.")


def _new_step(job_id: str, instance: str, old: str) -> str:
    """Cancel step `old` of `instance` and wait for the job to start its next one."""
    jobs.cancel(old)
    deadline = time.monotonic() + NEW_STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        for step in jobs.steps(job_id):
            if step.name == instance and step.step_id != old:
                return step.step_id
        time.sleep(0.2)
    raise DeployError(
        f"job {job_id} did not start {instance} again within {NEW_STEP_TIMEOUT_S:.0f} s of "
        f"scancel {old}; its output says why (`pdkit status` names it)."
    )


def _step_of(job_id: str, instance: str) -> str:
    for step in jobs.steps(job_id):
        if step.name == instance:
            return step.step_id
    raise DeployError(f"job {job_id} runs no step for {instance} now; `pdkit status` says why.")


def _restart_instance(
    ctx: DeployContext, console: Console, options: UpOptions, job_id: str, instance: str
) -> None:
    plan = ctx.plan
    ranks = [w for w in plan.workers if w.instance_name == instance]
    rank0: WorkerProcess = next(w for w in ranks if w.node_rank == 0)
    alone = len(plan.role(rank0.role)) // max(1, rank0.nnodes) <= 1
    router = plan.router
    drain = options.drain_timeout or DRAIN_TIMEOUT_S
    back_within = router.hold_timeout_s if alone else 0.0
    timeout = options.worker_timeout or plan.readiness_timeout_s or WORKER_TIMEOUT_S[plan.engine]
    key = router_key(ctx)

    async def take_out() -> None:
        async with RouterAdmin(router.kind, router.url, key, drain) as admin:
            drained = await admin.remove(rank0.url, back_within=back_within)
        how = "drained" if drained.clean else "cut off at the drain timeout"
        console.print(f"  {instance}: out of routing ({how} in {drained.seconds:.1f} s)")

    async def give_back() -> None:
        async with RouterAdmin(router.kind, router.url, key, drain) as admin:
            await admin.add(rank0.url, rank0.role, rank0.bootstrap_port)
            await admin.wait_routed(rank0.url, timeout)

    console.print(f"[bold]{instance}[/]: restarting as a new step of job {job_id}")
    asyncio.run(take_out())
    step = _new_step(job_id, instance, _step_of(job_id, instance))
    console.print(f"  {instance}: step {step} started; waiting for /health")
    targets = [t for t in worker_targets(plan) if t.name in {w.name for w in ranks}]
    statuses = wait_until_ready(ctx, console, targets, timeout, None)
    raise_unless_ready(ctx, statuses, stage="joining")
    asyncio.run(give_back())
    console.print(f"  {instance}: routed to again")


def _restart_router(ctx: DeployContext, console: Console, options: UpOptions, job_id: str) -> None:
    console.print(f"[bold]router[/]: restarting as a new step of job {job_id}")
    step = _new_step(job_id, "router", _step_of(job_id, "router"))
    console.print(f"  router: step {step} started; waiting for /readiness")
    timeout = options.router_timeout or ROUTER_TIMEOUT_S
    statuses = wait_until_ready(ctx, console, router_targets(ctx.plan), timeout, None)
    raise_unless_ready(ctx, statuses, stage="router")
