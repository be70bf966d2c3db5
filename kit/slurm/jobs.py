"""The deployment's Slurm job as pdkit sees it: submitted with sbatch, read with squeue and
scontrol, ended with scancel. Slurm's own clients are the only way in (they find the cluster
through SLURM_CONF or /etc/slurm); their output is parsed here and nowhere else.

A job that Slurm ends itself (its time limit, a preemption, a node failure) leaves slurmstepd's
line in the job's output (`*** JOB 12 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***`), which
`ended_by_slurm` reads, whether or not the cluster keeps accounting (sacct).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kit.errors import DeployError

CLIENT_TIMEOUT_S = 30.0
ENDED_BY_SLURM = re.compile(
    r"\*\*\* JOB (\d+) ON (\S+) CANCELLED AT (\S+) DUE TO (TIME LIMIT|PREEMPTION|NODE FAILURE)"
)
_REASONS = {
    "TIME LIMIT": "its time limit ran out",
    "PREEMPTION": "it was preempted",
    "NODE FAILURE": "a node failed",
}


@dataclass(frozen=True)
class JobState:
    """One squeue line of the job: its state (PENDING, RUNNING, COMPLETING, ...), why it
    waits, and its nodes (a Slurm host list, e.g. n[1-3])."""

    job_id: str
    state: str
    reason: str
    nodes: str
    elapsed: str
    time_limit: str


@dataclass(frozen=True)
class Step:
    """A running job step: its id (JOB.STEP), name (the instance, or `batch`) and nodes."""

    step_id: str
    name: str
    nodes: str
    elapsed: str


def _client(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """stdout of a Slurm client; `DeployError` naming the command when it fails."""
    if shutil.which(argv[0]) is None:
        raise DeployError(
            f"`{argv[0]}` is not on PATH: launcher slurm runs Slurm's clients (slurm-client) "
            "on this machine, a login node of the cluster."
        )
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_S,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DeployError(f"`{' '.join(argv)}` did not answer in {CLIENT_TIMEOUT_S:.0f} s") from exc
    if result.returncode != 0:
        raise DeployError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result.stdout


def submit(script: Path, env: Mapping[str, str], workdir: Path) -> str:
    """sbatch `script` (its #SBATCH lines say everything) from `workdir` with `env` exported
    to the job; returns the job id."""
    out = _client(["sbatch", "--parsable", f"--chdir={workdir}", str(script)], env)
    return out.strip().split(";")[0]


def job_state(job_id: str) -> JobState | None:
    """The job as squeue shows it, or None once Slurm no longer lists it."""
    try:
        out = _client(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r|%N|%M|%l"])
    except DeployError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 6 and fields[0] == job_id:
            return JobState(*fields)
    return None


def steps(job_id: str) -> list[Step]:
    """The job's running steps, in squeue's order (none once the job ended)."""
    try:
        out = _client(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j|%N|%M"])
    except DeployError as exc:
        if "Invalid job id" in str(exc):
            return []
        raise
    found = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 4:
            found.append(Step(*fields))
    return found


def hostnames(host_list: str) -> list[str]:
    """A Slurm host list (n[1-3],m7) as names, in Slurm's order."""
    return _client(["scontrol", "show", "hostnames", host_list]).split()


def cancel(target: str) -> None:
    """scancel a job (JOB) or one of its steps (JOB.STEP); quiet when it is gone already."""
    try:
        _client(["scancel", target])
    except DeployError as exc:
        if "Invalid job id" not in str(exc) and "already completing" not in str(exc):
            raise


def ended_by_slurm(output: str) -> str | None:
    """Why Slurm ended the job, from its output (slurmstepd's line), or None."""
    match = ENDED_BY_SLURM.search(output)
    if match is None:
        return None
    job, node, when, why = match.groups()
    return f"Slurm ended job {job} at {when} ({node}): {_REASONS[why]}"
