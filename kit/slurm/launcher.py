"""`pdkit up`, `down` and the job's part of `status` for a `launcher: slurm` topology.

up:
1. A job recorded for the deployment that Slurm still runs is kept: instances the topology
   added or removed since become steps added to or removed from it (kit/slurm/scale.py), and
   pdkit checks that it serves (the same gates).
2. Otherwise the batch script (kit/slurm/script.py, what `pdkit render` prints) is written
   under `slurm.root` and submitted with sbatch, the router's keys in its environment.
3. pdkit waits for the job to run and for the nodes file the job writes (each node's name and
   address, resolved on the node), records the job (`<root>/job.json`) and resolves the Plan
   on those nodes (kit.plan.resolve.resolve_on_nodes). The job waits while pdkit runs the host
   checks of `pdkit provision --check` as steps on every node (kit/slurm/preflight.py): all ok,
   pdkit writes the go file and the job starts the processes; else it cancels the job.
4. From there it is kit/deploy's rollout end as with Ansible: every worker's /health, the
   router's /readiness, the KV transfer gate, what serves and how to reach it.
down: scancel of the job (Slurm ends every step and process with it), then waits until squeue
no longer lists it, and forgets the record.

Every later command (status, health, doctor, bench, logs, trace) reads the Plan on the job's
nodes through `plan_on_job`, so none of them knows more about Slurm than the addresses.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from kit.deploy.steps import (
    WORKER_TIMEOUT_S,
    UpOptions,
    finish_rollout,
    playbook_secret_env,
    raise_unless_ready,
    wait_until_ready,
)
from kit.deploy.wait import worker_targets
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.hostcheck import exit_code
from kit.hosts.inventory import (
    CONTROL_ROUTER_ADMIN_KEY_ENV,
    CONTROL_ROUTER_KEY_ENV,
    ROUTER_ADMIN_KEY_ENV,
    ROUTER_KEY_ENV,
)
from kit.plan.resolve import resolve_on_nodes
from kit.slurm import jobs, scale
from kit.slurm.preflight import check_nodes, preflight_report
from kit.slurm.script import (
    HOLD_ENV,
    batch_script,
    go_file,
    nodes_file,
    output_file,
    sbatch_options,
)
from kit.topology.plan_types import Plan
from kit.topology.slurm_schema import Slurm

START_TIMEOUT_S = 300.0
"""Seconds the job may wait in the queue and resolve its nodes before `pdkit up` gives up."""
POLL_S = 0.5
HOLD_S = 600
"""Seconds the job waits for `pdkit up`'s host checks before it gives up (HOLD_ENV)."""
RECORD = "job.json"
STEP_ENDED = re.compile(r"^pdkit: step (\S+) ended \((status \d+)\)", re.M)


@dataclass(frozen=True)
class JobRecord:
    """What `pdkit up` recorded of the deployment's job: its id and, per topology host
    (node0, ...), the Slurm node and the address it resolved."""

    job_id: str
    nodes: dict[str, str]
    addresses: dict[str, str]
    script: str
    output: str
    steps: dict[str, list[list[Any]]] = field(default_factory=dict)
    """Each worker instance's step as the job runs it (kit/slurm/scale.py)."""
    allocation: list[str] = field(default_factory=list)
    """The sbatch options the job was submitted with."""


def _slurm(plan: Plan) -> Slurm:
    if plan.slurm is None:
        raise DeployError(f"deployment {plan.name} does not say launcher: slurm")
    return plan.slurm


def load_job(plan: Plan) -> JobRecord | None:
    """The recorded job of the deployment, or None."""
    path = Path(_slurm(plan).root) / RECORD
    try:
        return JobRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def _save_job(plan: Plan, record: JobRecord) -> None:
    (Path(_slurm(plan).root) / RECORD).write_text(json.dumps(asdict(record), indent=2) + "\n")


def _forget_job(plan: Plan) -> None:
    (Path(_slurm(plan).root) / RECORD).unlink(missing_ok=True)


def plan_on_job(topology: Path, plan: Plan, state_base: Path | None = None) -> Plan:
    """The Plan on the nodes of the deployment's recorded job (its placeholders otherwise)."""
    if plan.slurm is None:
        return plan
    record = load_job(plan)
    if record is None or not record.addresses:
        return plan
    return resolve_on_nodes(topology, record.addresses, state_base)


def _job_env(ctx: DeployContext) -> dict[str, str]:
    """What the job's steps inherit: this environment, pdkit's venv first on PATH when the
    topology names none, and the router's keys under the names the router reads."""
    slurm = _slurm(ctx.plan)
    env = dict(os.environ)
    if slurm.venv is None:
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    secret_env = playbook_secret_env(ctx)
    kind = ctx.plan.router.kind
    if CONTROL_ROUTER_KEY_ENV in secret_env:
        env[ROUTER_KEY_ENV[kind]] = secret_env[CONTROL_ROUTER_KEY_ENV]
    if CONTROL_ROUTER_ADMIN_KEY_ENV in secret_env and kind in ROUTER_ADMIN_KEY_ENV:
        env[ROUTER_ADMIN_KEY_ENV[kind]] = secret_env[CONTROL_ROUTER_ADMIN_KEY_ENV]
    return env


def up(
    topology: Path, plan: Plan, console: Console, options: UpOptions, state_base: Path | None
) -> None:
    """Submit the deployment's job (unless it runs), resolve the Plan on its nodes, and run
    the readiness gates, the router's and the KV transfer gate; returns once it serves."""
    slurm = _slurm(plan)
    root = Path(slurm.root)
    root.mkdir(parents=True, exist_ok=True)
    record = load_job(plan)
    state = jobs.job_state(record.job_id) if record is not None else None
    placeholder_ctx = DeployContext.build(plan, topology, state_base)
    if record is not None and state is not None and not record.addresses and not options.diff_only:
        # An earlier `pdkit up` stopped before the job named its nodes: start afresh.
        console.print(f"[bold]Slurm[/]: cancelling job {record.job_id}, never seen serving")
        jobs.cancel(record.job_id)
        state = None
    if record is not None and state is not None and state.state == "RUNNING":
        console.print(
            f"[bold]Slurm[/]: deployment {plan.name} runs as job {record.job_id} on "
            f"{state.nodes} ({state.elapsed} of {state.time_limit})"
            + ("." if options.diff_only else "; checking that it serves.")
        )
        on_nodes = resolve_on_nodes(topology, record.addresses, state_base)
        added, removed = scale.changes(plan, record.steps, record.allocation, record.job_id)
        what = "; ".join(
            part
            for part in (
                added and f"adding {', '.join(added)}",
                removed and f"removing {', '.join(removed)}",
            )
            if part
        )
        if options.diff_only:
            console.print(
                f"Job {record.job_id}: {what or 'no change'}. Nothing was changed (--diff)."
            )
            return
        if added or removed:
            console.print(f"[bold]Slurm[/]: job {record.job_id} changes live: {what}")
            scale.scale(
                DeployContext.build(on_nodes, topology, state_base),
                console,
                options,
                job_id=record.job_id,
                nodes=[record.nodes[h.name] for h in plan.hosts],
                added=added,
                removed=removed,
            )
            record = scale.updated(record, plan)
            _save_job(plan, record)
    elif options.diff_only:
        console.print(
            f"No job of {plan.name} runs: `pdkit up` submits one ({slurm.nodes} node(s) x "
            f"{slurm.gpus_per_node} GPU(s)); `pdkit render` prints its script. Nothing was "
            "changed (--diff)."
        )
        return
    else:
        env = _job_env(placeholder_ctx) | {HOLD_ENV: str(HOLD_S)}
        record = _submit(plan, console, env=env, options=options)
        on_nodes = resolve_on_nodes(topology, record.addresses, state_base)
        _preflight(topology, on_nodes, record, console)
    ctx = DeployContext.build(on_nodes, topology, state_base)
    timeout = options.worker_timeout or plan.readiness_timeout_s or WORKER_TIMEOUT_S[plan.engine]
    console.print(f"[bold]Workers[/]: waiting for /health (timeout {timeout:.0f} s)")
    statuses = wait_until_ready(ctx, console, worker_targets(ctx.plan), timeout, None)
    raise_unless_ready(ctx, statuses, stage="workers")
    secret_env = playbook_secret_env(ctx)
    finish_rollout(ctx, console, options, secret_env, statuses, monitoring=False, gate=options.gate)
    console.print(
        f"Slurm job {record.job_id}: `squeue -s -j {record.job_id}` lists its steps; "
        f"output {record.output}",
        markup=False,
    )


def _submit(plan: Plan, console: Console, *, env: dict[str, str], options: UpOptions) -> JobRecord:
    slurm = _slurm(plan)
    root = Path(slurm.root)
    script = root / "job.sh"
    script.write_text(batch_script(plan))
    job_id = jobs.submit(script, env, root)
    what = f"{slurm.nodes} node(s) x {slurm.gpus_per_node} GPU(s), time limit {slurm.time_limit}"
    if slurm.partition:
        what += f", partition {slurm.partition}"
    console.print(f"[bold]Slurm[/]: submitted job {job_id} ({what}), script {script}")
    output = output_file(slurm, job_id)
    # Recorded at once, so that `pdkit down` finds a job that `up` stopped waiting for.
    _save_job(plan, JobRecord(job_id, {}, {}, str(script), output))
    nodes_path = Path(nodes_file(slurm, job_id))
    deadline = time.monotonic() + max(START_TIMEOUT_S, options.worker_timeout or 0)
    said = ""
    while not nodes_path.exists() or len(nodes_path.read_text().splitlines()) < slurm.nodes:
        state = jobs.job_state(job_id)
        if state is None or state.state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise DeployError(_ended_report(job_id, output, state))
        if state.state == "PENDING" and state.reason not in (said, "None"):
            said = state.reason
            console.print(f"  job {job_id} is pending ({state.reason})", style="dim")
        if time.monotonic() > deadline:
            jobs.cancel(job_id)
            raise DeployError(
                f"job {job_id} did not start and name its nodes within "
                f"{deadline - time.monotonic() + START_TIMEOUT_S:.0f} s (last state "
                f"{state.state}, {state.reason}); it was cancelled. `sinfo` shows the partition."
            )
        time.sleep(POLL_S)
    hosts = [h.name for h in plan.hosts]
    pairs = [line.split() for line in nodes_path.read_text().splitlines()[: len(hosts)]]
    if any(len(pair) != 2 for pair in pairs):
        jobs.cancel(job_id)
        raise DeployError(
            f"job {job_id} could not resolve every node's address: {nodes_path} says "
            f"{nodes_path.read_text()!r}; it was cancelled. Its output: {output}"
        )
    record = JobRecord(
        job_id=job_id,
        nodes={host: pair[0] for host, pair in zip(hosts, pairs, strict=True)},
        addresses={host: pair[1] for host, pair in zip(hosts, pairs, strict=True)},
        script=str(script),
        output=output,
        steps=scale.recorded_steps(plan),
        allocation=sbatch_options(plan, slurm),
    )
    _save_job(plan, record)
    nodes = ", ".join(f"{h} = {record.nodes[h]} ({record.addresses[h]})" for h in hosts)
    console.print(f"[bold]Slurm[/]: job {job_id} runs on {nodes}")
    return record


def _preflight(topology: Path, plan: Plan, record: JobRecord, console: Console) -> None:
    """The host checks of `pdkit provision --check` as steps on every node of the job
    (kit/slurm/preflight.py), while the job waits; the go file when every item is ok, else the
    job is cancelled and `DeployError` says what to fix."""
    slurm = _slurm(plan)
    started = time.monotonic()
    try:
        items = check_nodes(plan, record.job_id, record.nodes)
    except BaseException:
        jobs.cancel(record.job_id)
        _forget_job(plan)
        raise
    if exit_code(items) != 0:
        jobs.cancel(record.job_id)
        _forget_job(plan)
        failed = sorted({i.host for i in items if i.verdict != "ok"})
        raise DeployError(
            "\n".join(
                [
                    f"The host checks failed on {', '.join(failed)} (those of `pdkit provision "
                    f"--check`, run as steps of job {record.job_id}); the job was cancelled and "
                    "nothing was started.",
                    *preflight_report(plan, items),
                    f"To fix: the items above, then `pdkit up {topology}` again; `pdkit "
                    f"provision {topology} --check` runs the same checks.",
                ]
            )
        )
    Path(go_file(slurm, record.job_id)).write_text("go\n")
    console.print(
        f"[bold]Preflight[/]: {len(items)} host check(s) on {len(record.nodes)} node(s), run "
        f"as job steps: all ok ({time.monotonic() - started:.1f} s); starting the processes"
    )


def _ended_report(job_id: str, output: str, state: jobs.JobState | None) -> str:
    text = _read(output)
    why = jobs.ended_by_slurm(text)
    if why is None:
        why = f"job {job_id} " + (f"is {state.state} ({state.reason})" if state else "ended")
    tail = "\n".join(f"  | {line}" for line in text.splitlines()[-15:])
    text_fix = ""
    if "pdkit: preflight" in text:
        text_fix = (
            "\nTo fix: the nodes must hold the workers' environment: slurm.venv (or "
            "slurm.container_image) with pdkit (and SGLang for engine sglang) on every node, and "
            "the GPUs slurm.gpus_per_node asks for; the lines above name what a node lacks."
        )
    return f"{why} before its processes started. Its output ({output}):\n{tail}{text_fix}"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def down(plan: Plan, console: Console, timeout: float = 60.0) -> None:
    """scancel the deployment's job and wait until Slurm lists it no more."""
    record = load_job(plan)
    if record is None:
        console.print(f"Deployment {plan.name}: no Slurm job is recorded; nothing to stop.")
        return
    console.print(f"[bold]Slurm[/]: cancelling job {record.job_id} (every step with it)")
    jobs.cancel(record.job_id)
    deadline = time.monotonic() + timeout
    while (state := jobs.job_state(record.job_id)) is not None:
        if time.monotonic() > deadline:
            raise DeployError(
                f"job {record.job_id} is still {state.state} {timeout:.0f} s after scancel; "
                f"`squeue -j {record.job_id}` shows it, `scontrol show job {record.job_id}` why."
            )
        time.sleep(POLL_S)
    _forget_job(plan)
    console.print(f"Stopped: job {record.job_id} is gone; logs stay under {_slurm(plan).root}.")


def job_report(plan: Plan) -> list[str]:
    """Lines for `pdkit status`: the job, its nodes and steps, or how it ended."""
    record = load_job(plan)
    if record is None:
        return [f"Slurm: no job recorded for {plan.name} (`pdkit up` submits one)."]
    state = jobs.job_state(record.job_id)
    if state is None or state.state not in ("RUNNING", "PENDING", "CONFIGURING"):
        why = jobs.ended_by_slurm(_read(record.output))
        if why is None:
            why = f"job {record.job_id} " + (
                f"is {state.state}" if state else "is no longer known to Slurm"
            )
        return [f"Slurm: {why}; nothing of the deployment runs. Output: {record.output}"]
    nodes = ", ".join(f"{h}={n}" for h, n in record.nodes.items())
    lines = [
        f"Slurm: job {record.job_id} {state.state} for {state.elapsed} of {state.time_limit} "
        f"on {state.nodes} ({nodes})"
    ]
    running = jobs.steps(record.job_id)
    names = {s.name for s in running}
    instances = sorted({w.instance_name for w in plan.workers} | {plan.router.name})
    for step in running:
        if step.name in instances:
            lines.append(
                f"  step {step.step_id:<10} {step.name:<14} {step.nodes:<10} {step.elapsed}"
            )
    for name, count, status in step_restarts(_read(record.output)):
        lines.append(
            f"  {name} started again by the job {count} time(s) (its last step ended: {status})"
        )
    missing = [name for name in instances if name not in names]
    if missing:
        lines.append(
            f"  no step now for {', '.join(missing)} (ended; the job starts it again in 2 s)"
        )
    return lines


def step_restarts(output: str) -> list[tuple[str, int, str]]:
    """(instance, times, last status) of every step the job started again, from its output
    (the batch script's `pdkit: step NAME ended (status N)` lines)."""
    found: dict[str, tuple[int, str]] = {}
    for match in STEP_ENDED.finditer(output):
        name, status = match.groups()
        found[name] = (found.get(name, (0, ""))[0] + 1, status)
    return [(name, count, status) for name, (count, status) in sorted(found.items())]
