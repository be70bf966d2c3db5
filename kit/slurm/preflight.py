"""The host checks of `pdkit provision --check`, run as job steps on the allocation's nodes.

On Slurm pdkit cannot ssh to a node; it reaches a node through a step of a job that holds it
(`srun --overlap --jobid=JOB --nodelist=NODE`), with the same probes and verdicts as over SSH:
1. `gather`: on every node at once, the probe scripts playbooks/check.yml runs (the role
   pdkit_check's host_check.py with `check_spec`, pdkit_nvidia's nvidia_facts.py where GPU
   workers run, pdkit_rdma's rdma_facts.py where they move KV over RDMA), each a step reading
   its script on stdin, run by the interpreter the steps run (`node_python`).
2. `check_nodes`: `judge_all` over those facts, and `check_reach` (every port a node must
   reach on another) with each probe a step on its node: the same `CheckItem`s and table.
   What `pdkit provision` would install is the site's to install on Slurm (`slurm_fix`).
`pdkit up` runs them in the deployment's job before any process starts (the job waits for its
go file) and cancels the job when an item is not ok; `pdkit provision --check` (`check`) runs
them in an allocation of its own (`salloc --no-shell`), or in the deployment's job when it runs.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console

from kit.errors import DeployError
from kit.hosts.hostcheck import (
    CheckItem,
    check_spec,
    exit_code,
    judge_all,
    reach_items,
    report,
)
from kit.hosts.inventory import DeployHost, deploy_hosts
from kit.hosts.playbook import host_script
from kit.hosts.reach import HostCommand, check_reach
from kit.slurm import jobs
from kit.topology.plan_types import Plan
from kit.topology.slurm_schema import Slurm

PROBE_TIMEOUT_S = 120.0
"""Seconds one probe step may take (a step starting, a Python reading the host)."""
CHECK_TIME_LIMIT = "10"
"""The time limit (minutes) of the allocation `pdkit provision --check` asks for."""
GRANT_TIMEOUT_S = 300.0

SLURM_VERDICTS = {
    0: "every node has what it needs",
    1: "some items need fixing on the nodes (FAIL above)",
    2: "the nodes' environment lacks what is listed above (on Slurm the site installs it)",
}


def node_python(slurm: Slurm) -> str:
    """The interpreter the job's steps run: the venv's, `python3` in a container image, else
    the one pdkit runs with (the job's PATH starts with its venv)."""
    if slurm.venv:
        return str(PurePosixPath(slurm.venv, "bin", "python"))
    if slurm.container_image:
        return "python3"
    return sys.executable


def node_hosts(plan: Plan) -> tuple[DeployHost, ...]:
    """The Plan's hosts (the allocation's nodes) as the checks see them: local hosts (no SSH)
    running the steps' interpreter."""
    assert plan.slurm is not None
    return deploy_hosts(plan, node_python(plan.slurm))


def step_command(job_id: str, nodes: Mapping[str, str], slurm: Slurm) -> HostCommand:
    """How to run an argv on a topology host (node0, ...): a step of job `job_id` on its node."""

    def run_on(host: DeployHost, command: list[str]) -> list[str]:
        argv = ["srun", "--overlap", f"--jobid={job_id}", "--nodes=1", "--ntasks=1"]
        argv.append(f"--nodelist={nodes[host.name]}")
        if slurm.container_image:
            argv.append(f"--container-image={slurm.container_image}")
        return [*argv, "--quiet", *command]

    return run_on


def _probe(
    run_on: HostCommand, host: DeployHost, role: str, script: str, args: Sequence[str]
) -> Any:
    """One probe script, sent on stdin to the node's Python in a step; its JSON output."""
    argv = run_on(host, [host.python, "-", *args])
    try:
        done = subprocess.run(
            argv,
            input=host_script(role, script),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"{script} on {host.name} did not answer: {exc}") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise DeployError(
            f"{script} could not run on {host.name} as a job step (`{shlex.join(argv)}`): "
            f"{why}. To fix: slurm.venv (or slurm.container_image) must give the nodes a "
            "Python 3."
        )
    return json.loads(lines[-1])


def _facts(plan: Plan, host: DeployHost, run_on: HostCommand) -> dict[str, Any]:
    """What check.yml's pdkit_check role returns for `host` (`pdkit_check_facts`)."""
    spec = check_spec(plan, host, {})
    encoded = json.dumps(spec["pdkit_check_spec"]).encode()
    facts: dict[str, Any] = {
        "host": _probe(
            run_on, host, "pdkit_check", "host_check.py", [base64.b64encode(encoded).decode()]
        ),
        "nvidia": None,
        "rdma": None,
    }
    if spec["pdkit_check_gpu"]:
        facts["nvidia"] = _probe(run_on, host, "pdkit_nvidia", "nvidia_facts.py", ["/proc"])
    if spec["pdkit_check_rdma"]:
        gid = str(spec["pdkit_check_spec"]["gid_index"])
        args = ["/sys/class/infiniband", gid, "/proc"]
        facts["rdma"] = _probe(run_on, host, "pdkit_rdma", "rdma_facts.py", args)
    return facts


def gather(
    plan: Plan, hosts: Sequence[DeployHost], run_on: HostCommand
) -> dict[str, dict[str, Any]]:
    """Every node's facts, the nodes probed at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        found = {h.name: pool.submit(_facts, plan, h, run_on) for h in hosts}
        return {name: future.result() for name, future in found.items()}


def slurm_fix(item: CheckItem, slurm: Slurm) -> CheckItem:
    """An item's fix on Slurm: what `pdkit provision` would install is the site's to install
    in the nodes' environment."""
    if item.verdict != "install":
        return item
    where = (
        f"the image {slurm.container_image}"
        if slurm.container_image
        else f"slurm.venv ({slurm.venv})"
        if slurm.venv
        else f"the venv pdkit runs from ({sys.prefix}), which the nodes use (no slurm.venv)"
    )
    return dataclasses.replace(
        item, fix=f"install it in {where}: pdkit does not provision Slurm nodes"
    )


def check_nodes(plan: Plan, job_id: str, nodes: Mapping[str, str]) -> list[CheckItem]:
    """The checklist of `pdkit provision --check` on the nodes of job `job_id` (`nodes`: topology
    host -> Slurm node), every probe a step: `judge_all`, then the reachable ports."""
    slurm = plan.slurm
    assert slurm is not None
    hosts = node_hosts(plan)
    run_on = step_command(job_id, nodes, slurm)
    items = judge_all(plan, hosts, gather(plan, hosts, run_on))
    items += reach_items(check_reach(plan, {h.name: h for h in hosts}, run_on=run_on))
    return [slurm_fix(i, slurm) for i in items]


def preflight_report(plan: Plan, items: Sequence[CheckItem]) -> list[str]:
    """The table, each fix and the verdict, in Slurm's words."""
    return report(plan.name, items, SLURM_VERDICTS)


def environment_lines(slurm: Slurm, exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """What the nodes' environment is, as the topology says it, and whether this machine sees
    the venv (a login node usually shares the nodes' file system)."""
    if slurm.container_image:
        return [
            f"Environment: every step runs in the image {slurm.container_image} "
            "(slurm.container_image, pyxis/enroot); checked inside it on the nodes."
        ]
    if slurm.venv:
        python = node_python(slurm)
        seen = "present here" if exists(python) else "NOT present on this machine"
        return [f"Environment: slurm.venv {slurm.venv} ({python} {seen}); checked on the nodes."]
    return [
        f"Environment: no slurm.venv or slurm.container_image: the nodes run pdkit's own venv "
        f"({sys.prefix}), which they must see at that path; checked on the nodes."
    ]


def check(topology: Path, plan: Plan, console: Console, state_base: Path | None) -> int:
    """`pdkit provision --check` on a `launcher: slurm` topology: the nodes' environment, then
    the checklist on the deployment's job's nodes when it runs, else on an allocation of the
    same shape taken for the check and released after. Returns `exit_code`."""
    from kit.plan.resolve import resolve_on_nodes  # noqa: PLC0415
    from kit.slurm.launcher import load_job  # noqa: PLC0415

    slurm = plan.slurm
    assert slurm is not None
    for line in environment_lines(slurm):
        console.print(line, markup=False)
    record = load_job(plan)
    state = jobs.job_state(record.job_id) if record is not None else None
    if record is not None and state is not None and state.state == "RUNNING" and record.nodes:
        console.print(f"Checking on the nodes of job {record.job_id} (the deployment's), as steps")
        on_nodes = resolve_on_nodes(topology, record.addresses, state_base)
        items = check_nodes(on_nodes, record.job_id, record.nodes)
    else:
        job_id = allocate(plan, slurm)
        try:
            nodes = allocated_nodes(plan, job_id)
            console.print(
                f"Checking on job {job_id}, an allocation of {slurm.nodes} node(s) for the check "
                f"({', '.join(f'{h} = {n}' for h, n in nodes.items())}), as steps"
            )
            addresses = {h: node_address(job_id, n) for h, n in nodes.items()}
            items = check_nodes(resolve_on_nodes(topology, addresses, state_base), job_id, nodes)
        finally:
            jobs.cancel(job_id)
    for line in preflight_report(plan, items):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return exit_code(items)


def allocate(plan: Plan, slurm: Slurm) -> str:
    """An allocation of the deployment's shape for the check (salloc --no-shell, which returns
    once it is granted); its job id."""
    from kit.slurm.script import job_name, sbatch_options  # noqa: PLC0415

    options = [
        o
        for o in sbatch_options(plan, slurm)
        if not o.startswith(("--output=", "--time=", "--job-name="))
    ]
    argv = ["salloc", "--no-shell", f"--job-name={job_name(plan)}-check"]
    argv += [f"--time={CHECK_TIME_LIMIT}", *options]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=GRANT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DeployError(
            f"`{shlex.join(argv)}` was not granted within {GRANT_TIMEOUT_S:.0f} s; "
            "`squeue` shows why."
        ) from exc
    text = done.stdout + done.stderr
    for word in text.split():
        if word.isdigit() and "Granted job allocation" in text:
            return word
    raise DeployError(f"`{shlex.join(argv)}` failed: {text.strip()}")


def allocated_nodes(plan: Plan, job_id: str) -> dict[str, str]:
    """Topology host -> Slurm node of job `job_id`, in the batch script's order."""
    deadline = time.monotonic() + GRANT_TIMEOUT_S
    while (state := jobs.job_state(job_id)) is None or state.state != "RUNNING":
        if time.monotonic() > deadline:
            raise DeployError(f"job {job_id} is not running: `squeue -j {job_id}` says why.")
        time.sleep(0.2)
    names = jobs.hostnames(state.nodes)
    return {h.name: n for h, n in zip(plan.hosts, names, strict=False)}


def node_address(job_id: str, node: str) -> str:
    """The node's first address, as the node sees it (the batch script's `pdkit_address`)."""
    argv = ["srun", "--overlap", f"--jobid={job_id}", "--nodes=1", "--ntasks=1"]
    argv += [f"--nodelist={node}", "--quiet", "hostname", "-I"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    words = done.stdout.split()
    if done.returncode != 0 or not words:
        raise DeployError(f"`{shlex.join(argv)}` failed: {done.stderr.strip()}")
    return words[0]
