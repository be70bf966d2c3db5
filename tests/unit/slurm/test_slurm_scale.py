"""A changed count on a running job: instances added and removed as steps; what a running job
cannot change (its allocation, a staying instance's command) refused with the way out."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kit.errors import DeployError
from kit.plan.resolve import resolve
from kit.slurm.scale import changes, recorded_steps
from kit.slurm.script import added_step, instance_steps, sbatch_options
from tests.conftest import REPO

TOPOLOGY = REPO / "topologies" / "local-slurm.yaml"


def _plan(tmp_path, **prefill):
    data = yaml.safe_load(TOPOLOGY.read_text())
    data["prefill"] |= prefill
    data["slurm"]["root"] = str(REPO / ".pdkit" / "local-slurm")
    data["slurm"]["venv"] = str(REPO / ".venv")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return resolve(path)


def test_a_lower_count_removes_and_a_higher_one_adds(tmp_path):
    two = _plan(tmp_path)
    one = _plan(tmp_path, count=1)
    assert two.slurm is not None
    allocation = sbatch_options(two, two.slurm)
    assert changes(one, recorded_steps(two), allocation, "7") == ([], ["prefill-1"])
    assert changes(two, recorded_steps(one), allocation, "7") == (["prefill-1"], [])
    assert changes(two, recorded_steps(two), allocation, "7") == ([], [])


def test_a_changed_command_or_allocation_is_refused(tmp_path):
    two = _plan(tmp_path)
    assert two.slurm is not None
    allocation = sbatch_options(two, two.slurm)
    moved = _plan(tmp_path, port=31000)
    with pytest.raises(DeployError, match="the command of prefill-0, prefill-1 differs"):
        changes(moved, recorded_steps(two), allocation, "7")
    with pytest.raises(DeployError, match="a running job keeps its allocation"):
        changes(two, recorded_steps(two), [*allocation[:-1], "--time=9"], "7")


def test_an_added_step_runs_its_node_ranks_on_the_named_nodes():
    plan = resolve(TOPOLOGY)
    ranks = instance_steps(plan)["decode-0"]
    text = added_step(ranks, ["n1", "n2", "n3"])
    assert text.startswith('case "$SLURMD_NODENAME" in\n  n2)\n')
    assert "\n  n3)\n" in text and "--node-rank 1" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0
