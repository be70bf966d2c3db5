"""The host checks as job steps: each probe is a step of the job on its node, every route
between nodes is checked (the nodes' stand-in hosts are not one machine), and what provisioning
would install is the site's to install."""

from __future__ import annotations

from kit.hosts.hostcheck import CheckItem
from kit.hosts.reach import routes
from kit.plan.resolve import resolve
from kit.slurm.preflight import environment_lines, node_hosts, slurm_fix, step_command
from tests.conftest import REPO, run_pdkit

TOPOLOGY = REPO / "topologies" / "local-slurm.yaml"


def test_each_probe_runs_as_a_step_of_the_job_on_its_node():
    plan = resolve(TOPOLOGY)
    assert plan.slurm is not None
    hosts = node_hosts(plan)
    assert hosts[0].python == f"{plan.slurm.venv}/bin/python"
    run_on = step_command("12", {"node0": "n1", "node1": "n2"}, plan.slurm)
    argv = run_on(hosts[1], [hosts[1].python, "-", "SPEC"])
    assert argv[:2] == ["srun", "--overlap"]
    assert "--jobid=12" in argv and "--nodelist=n2" in argv
    assert argv[-3:] == [hosts[1].python, "-", "SPEC"]
    image = plan.slurm.model_copy(update={"container_image": "sglang.sqsh"})
    assert "--container-image=sglang.sqsh" in step_command("12", {"node0": "n1"}, image)(
        hosts[0], ["true"]
    )


def test_every_route_between_nodes_is_checked():
    plan = resolve(TOPOLOGY)
    found = {(r.source, r.target, r.what) for r in routes(plan)}
    # The decode (node1, node2) reaches both prefills' bootstrap ports on node0; its second
    # node reaches its first one's dist-init port.
    assert ("node1", "node0", "bootstrap") in found
    assert ("node2", "node0", "bootstrap") in found
    assert any(source == "node2" and target == "node1" for source, target, _ in found)


def test_what_provisioning_installs_is_the_sites_to_install_on_slurm():
    plan = resolve(TOPOLOGY)
    assert plan.slurm is not None
    missing = CheckItem("node0", "SGLang", "sglang==0.5.23", "not installed", "install", "x")
    assert slurm_fix(missing, plan.slurm).fix == (
        f"install it in slurm.venv ({plan.slurm.venv}): pdkit does not provision Slurm nodes"
    )
    failed = CheckItem("node0", "ports", "free", "held", "fail", "stop it")
    assert slurm_fix(failed, plan.slurm) == failed


def test_the_environment_is_named_and_a_missing_venv_said():
    plan = resolve(TOPOLOGY)
    assert plan.slurm is not None
    (line,) = environment_lines(plan.slurm, exists=lambda _: False)
    assert f"slurm.venv {plan.slurm.venv}" in line and "NOT present on this machine" in line
    image = plan.slurm.model_copy(update={"container_image": "sglang.sqsh", "venv": None})
    assert "the image sglang.sqsh" in environment_lines(image)[0]


def test_provisioning_slurm_nodes_is_refused_and_check_named():
    done = run_pdkit("provision", str(TOPOLOGY))
    assert done.returncode == 1
    assert "pdkit does not provision Slurm nodes" in done.stderr
    assert f"`pdkit provision {TOPOLOGY} --check` says what the nodes lack" in done.stderr
