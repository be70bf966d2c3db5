"""`pdkit up` on a running Slurm deployment whose instance counts changed: steps added to and
removed from its job, within the allocation it holds.

1. What runs is what the job record says (`JobRecord.steps`: each instance's step as the batch
   script runs it, `instance_steps` of the Plan it was submitted with) in the allocation it
   asked for (`JobRecord.allocation`, its sbatch options). `changes` compares the topology's
   Plan with it: instances added and removed. A changed `slurm:` or a changed command of an
   instance that stays is refused: a running job keeps its allocation and its steps' commands
   (`pdkit down`, `pdkit up`). A topology whose instances do not fit the allocation fails its
   placement; `no_room` says so in the allocation's words.
2. Each removed instance leaves the router first (drained), then `<steps>/NAME.removed` tells
   the job not to start it again, and its step is cancelled. The router's launch with the new
   worker list goes to `<steps>/router.sh`, which its step runs the next time it starts.
3. Each added instance is written for the job's loop (`<steps>/NAME.sh`, `NAME.nodes`, then
   `NAME.add`), which starts it as a step on its nodes and keeps it; pdkit waits for its /health
   and gives it to the router, until the router routes to it.
Then `pdkit up`'s usual end runs: every worker's /health, the router's /readiness, the KV
transfer gate over every pair.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from kit.deploy.routing import RouterAdmin
from kit.deploy.steps import (
    DRAIN_TIMEOUT_S,
    WORKER_TIMEOUT_S,
    UpOptions,
    raise_unless_ready,
    router_key,
    wait_until_ready,
)
from kit.deploy.wait import worker_targets
from kit.errors import DeployError, PdkitError
from kit.hosts.context import DeployContext
from kit.slurm import jobs
from kit.slurm.script import (
    added_step,
    instance_steps,
    router_step,
    sbatch_options,
    steps_dir,
)
from kit.topology.plan_types import Plan

STEP_TIMEOUT_S = 30.0
"""Seconds for the job to start an added step, or to end a removed one."""


def recorded_steps(plan: Plan) -> dict[str, list[list[Any]]]:
    """`instance_steps` as the job record keeps it (JSON's lists)."""
    return {name: [list(r) for r in ranks] for name, ranks in instance_steps(plan).items()}


def changes(
    plan: Plan, running: dict[str, list[list[Any]]], allocation: list[str], job_id: str
) -> tuple[list[str], list[str]]:
    """(added, removed) instances between what job `job_id` runs and the Plan; `DeployError`
    for what a running job cannot change (its allocation, a staying instance's command).
    A record without steps (written by an older pdkit) changes nothing."""
    assert plan.slurm is not None
    if not running:
        return [], []
    if allocation and allocation != sbatch_options(plan, plan.slurm):
        raise DeployError(
            f"slurm: differs from what job {job_id} was submitted with "
            f"({' '.join(allocation)}); a running job keeps its allocation. To change it: "
            "`pdkit down`, then `pdkit up`."
        )
    wanted = recorded_steps(plan)
    changed = [n for n in wanted if n in running and running[n] != wanted[n]]
    if changed:
        raise DeployError(
            f"the command of {', '.join(changed)} differs from what job {job_id} runs (placement "
            "moved it, or its settings changed); a running job changes only which instances "
            "run. To apply it: `pdkit down`, then `pdkit up`."
        )
    added = [n for n in wanted if n not in running]
    removed = [n for n in running if n not in wanted]
    return added, removed


def scale(
    ctx: DeployContext,
    console: Console,
    options: UpOptions,
    *,
    job_id: str,
    nodes: list[str],
    added: list[str],
    removed: list[str],
) -> None:
    """Remove then add instances as steps of the running job (the module doc); `ctx` is the
    new Plan on the job's nodes, `nodes` the job's node names in the topology's order."""
    plan = ctx.plan
    slurm = plan.slurm
    assert slurm is not None
    folder = Path(steps_dir(slurm, job_id))
    folder.mkdir(parents=True, exist_ok=True)
    router = plan.router
    key = router_key(ctx)
    drain = options.drain_timeout or DRAIN_TIMEOUT_S
    timeout = options.worker_timeout or plan.readiness_timeout_s or WORKER_TIMEOUT_S[plan.engine]
    keep = {w.url.rstrip("/") for w in plan.workers if w.node_rank == 0}

    async def drain_stray() -> list[str]:
        async with RouterAdmin(router.kind, router.url, key, drain) as admin:
            gone = [url for url in await admin.workers() if url not in keep]
            for url in gone:
                await admin.remove(url)
            return gone

    if removed:
        for url in asyncio.run(drain_stray()):
            console.print(f"  {url}: out of routing (drained)")
    for name in removed:
        (folder / f"{name}.removed").write_text("")
        for running in jobs.steps(job_id):
            if running.name == name:
                jobs.cancel(running.step_id)
        _wait_steps(job_id, name, present=False)
        console.print(f"[bold]{name}[/]: removed (its step of job {job_id} ended)")

    # The router's step, when it starts again (a restart, a crash), starts with the new list.
    (folder / f"{router.name}.sh").write_text(added_step(router_step(plan), nodes))
    ranks = instance_steps(plan)
    for name in added:
        (folder / f"{name}.removed").unlink(missing_ok=True)
        mine = ranks[name]
        (folder / f"{name}.sh").write_text(added_step(mine, nodes))
        node_list = ",".join(nodes[index] for index, _ in mine)
        (folder / f"{name}.nodes").write_text(f"{len(mine)} {node_list}\n")
        (folder / f"{name}.add").write_text("")
        step = _wait_steps(job_id, name, present=True)
        console.print(f"[bold]{name}[/]: added as step {step} of job {job_id} on {node_list}")
    if not added:
        return
    names = {w.name for w in plan.workers if w.instance_name in added}
    targets = [t for t in worker_targets(plan) if t.name in names]
    statuses = wait_until_ready(ctx, console, targets, timeout, None)
    raise_unless_ready(ctx, statuses, stage="joining")

    async def give() -> None:
        async with RouterAdmin(router.kind, router.url, key, drain) as admin:
            for worker in plan.workers:
                if worker.instance_name in added and worker.node_rank == 0:
                    await admin.add(worker.url, worker.role, worker.bootstrap_port)
                    await admin.wait_routed(worker.url, timeout)

    asyncio.run(give())
    console.print(f"  {', '.join(added)}: routed to")


def _wait_steps(job_id: str, name: str, *, present: bool) -> str:
    """Until job `job_id` runs a step named `name` (its id), or none (`present` False)."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        found = [s.step_id for s in jobs.steps(job_id) if s.name == name]
        if bool(found) == present:
            return found[0] if found else ""
        time.sleep(0.2)
    what = "start" if present else "end"
    raise DeployError(
        f"job {job_id} did not {what} the step of {name} within {STEP_TIMEOUT_S:.0f} s; "
        "its output says why (`pdkit status` names it)."
    )


def no_room(topology: Path, error: PdkitError) -> PdkitError:
    """`error` (the topology's placement failed), with the running job's allocation named
    when the deployment runs as a Slurm job: its instances must fit that allocation."""
    from kit.slurm.launcher import RECORD, JobRecord  # noqa: PLC0415

    try:
        data = yaml.safe_load(topology.read_text())
        raw = data["slurm"]
        root = Path(str(raw.get("root", ".pdkit/slurm")))
        folder = root if root.is_absolute() else topology.absolute().parent / root
        record = JobRecord(**json.loads((folder / RECORD).read_text()))
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return error
    state = jobs.job_state(record.job_id)
    if state is None or state.state != "RUNNING" or "GPUs" not in str(error):
        return error
    return DeployError(
        f"{error}\nThe deployment runs as Slurm job {record.job_id} on {state.nodes} "
        f"({len(record.nodes)} node(s) x {raw.get('gpus_per_node')} GPU(s)): that allocation "
        "has no room for these instances. A running job keeps its allocation: lower the "
        "counts, or `pdkit down` and `pdkit up` with a larger slurm.nodes."
    )


def updated(record: Any, plan: Plan) -> Any:
    """The job record with the Plan's steps as what runs."""
    return dataclasses.replace(record, steps=recorded_steps(plan))
