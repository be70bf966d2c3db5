"""What pdkit reads back from a Slurm job's output: why Slurm ended it, and which steps the job
started again."""

from __future__ import annotations

from kit.slurm.jobs import ended_by_slurm
from kit.slurm.launcher import step_restarts


def test_a_job_ended_by_its_time_limit_is_reported_as_such():
    output = (
        "pdkit: step prefill-0 ended (status 137); starting it again in 2 s\n"
        "slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026-12-04T18:00:00 DUE TO TIME "
        "LIMIT ***\n"
    )
    assert ended_by_slurm(output) == (
        "Slurm ended job 12 at 2026-12-04T18:00:00 (n1): its time limit ran out"
    )
    preempted = output.replace("TIME LIMIT", "PREEMPTION")
    assert ended_by_slurm(preempted).endswith("it was preempted")
    assert ended_by_slurm(output.replace("TIME LIMIT", "NODE FAILURE")).endswith("a node failed")


def test_a_job_cancelled_by_a_user_is_not_ended_by_slurm():
    assert ended_by_slurm("slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026 ***") is None


def test_the_steps_the_job_started_again_are_counted():
    output = (
        "pdkit: step prefill-0 ended (status 137); starting it again in 2 s\n"
        "srun: error: n1: task 0: Killed\n"
        "pdkit: step decode-0 ended (status 1); starting it again in 2 s\n"
        "pdkit: step prefill-0 ended (status 143); starting it again in 2 s\n"
    )
    assert step_restarts(output) == [("decode-0", 1, "status 1"), ("prefill-0", 2, "status 143")]
