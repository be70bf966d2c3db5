"""`pdkit up` through a real Slurm: topologies/local-slurm.yaml (the sim engine: two 1-node
prefills, a decode over 2 nodes, pdkit's router) on the local 3-node cluster of
tests/support/slurm_cluster.py (started here when it does not run, stopped after).

One deployment for the module, in order: up serves chat through the router (the `openai`
client), status lists the job and its steps, doctor passes, a step cancelled from outside is
noticed and started again by the job, a restart of one instance under load fails no request,
and down leaves no job, step or process on any node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from openai import OpenAI

from tests.conftest import REPO, run_pdkit
from tests.support.slurm_cluster import NETNS_PREFIX, NODES, SlurmCluster, unavailable_reason

NAME = "e2e-slurm"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests, but {reason}", pytrace=False)
        pytest.skip(reason)
    cluster = SlurmCluster()
    started = not cluster.running()
    cluster.up()
    yield cluster
    if started:
        cluster.down()


def pdkit(cluster: SlurmCluster, *args: str, timeout: float = 180):
    env = {**os.environ, **cluster.env(), "COLUMNS": "200"}
    return run_pdkit(*args, timeout=timeout, env=env)


def slurm(cluster: SlurmCluster, *argv: str) -> str:
    env = {**os.environ, **cluster.env()}
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, check=True, timeout=30
    ).stdout


@pytest.fixture(scope="module")
def topology(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("slurm")
    data = yaml.safe_load((REPO / "topologies" / "local-slurm.yaml").read_text())
    data["name"] = NAME
    data["slurm"] |= {"venv": sys.prefix, "root": str(folder / "shared")}
    path = folder / "local-slurm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    up = pdkit(cluster, "up", str(path))
    assert up.returncode == 0, up.stdout + up.stderr
    (folder / "up.out").write_text(up.stdout)
    yield path
    pdkit(cluster, "down", str(path))


def job_id(topology: Path) -> str:
    return json.loads((topology.parent / "shared" / "job.json").read_text())["job_id"]


def router_url(topology: Path) -> str:
    record = json.loads((topology.parent / "shared" / "job.json").read_text())
    return f"http://{record['addresses']['node0']}:8000"


def test_up_serves_chat_through_the_router_and_squeue_shows_the_job(cluster, topology):
    queue = slurm(cluster, "squeue", "-h", "-o", "%i %j %T")
    assert f"{job_id(topology)} pdkit-{NAME} RUNNING" in queue
    client = OpenAI(base_url=f"{router_url(topology)}/v1", api_key="none", timeout=30)
    reply = client.chat.completions.create(
        model="llama-3.1-8b",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
    )
    assert reply.choices[0].message.content


def test_the_host_checks_ran_as_job_steps_before_any_process(cluster, topology):
    up = (topology.parent / "up.out").read_text()
    assert "Preflight: " in up and "node(s), run as job steps: all ok" in up
    assert up.index("Preflight: ") < up.index("Workers: waiting")
    check = pdkit(cluster, "provision", str(topology), "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"Checking on the nodes of job {job_id(topology)}" in check.stdout
    assert "node2  reachable ports" in check.stdout
    assert f"Checked {NAME}: every node has what it needs." in check.stdout


def test_a_second_deployment_on_the_same_ports_is_refused_by_the_host_checks(
    cluster, topology, tmp_path
):
    data = yaml.safe_load(topology.read_text())
    data["name"] = f"{NAME}-b"
    data["slurm"]["root"] = str(tmp_path / "shared")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    up = pdkit(cluster, "up", str(other))
    assert up.returncode == 1, up.stdout + up.stderr
    text = up.stdout + up.stderr
    assert "The host checks failed on node0, node1, node2" in text
    assert "the job was cancelled and nothing was started" in text
    assert "30000 (prefill-0 HTTP) held by pid" in text
    assert f"Checked {NAME}-b: some items need fixing on the nodes (FAIL above)." in text
    assert not (tmp_path / "shared" / "job.json").exists()
    deadline = time.monotonic() + 30
    while f"pdkit-{NAME}-b" in slurm(cluster, "squeue", "-h", "-o", "%j"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert f"pdkit-{NAME} " in slurm(cluster, "squeue", "-h", "-o", "%j ")
    # Without a job of its own, --check takes an allocation for the check and releases it.
    check = pdkit(cluster, "provision", str(other), "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "an allocation of 3 node(s) for the check" in check.stdout
    assert "30000 (prefill-0 HTTP) held by pid" in check.stdout
    deadline = time.monotonic() + 30
    while f"pdkit-{NAME}-b-check" in slurm(cluster, "squeue", "-h", "-o", "%j"):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_up_again_keeps_the_running_job(cluster, topology):
    again = pdkit(cluster, "up", str(topology))
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"runs as job {job_id(topology)} on n[1-3]" in again.stdout
    assert "submitted" not in again.stdout


def test_status_names_the_job_its_nodes_and_a_step_per_instance(cluster, topology):
    status = pdkit(cluster, "status", str(topology))
    assert status.returncode == 0, status.stdout + status.stderr
    job = job_id(topology)
    assert f"Slurm: job {job} RUNNING" in status.stdout
    assert "node0=n1, node1=n2, node2=n3" in status.stdout
    for instance in ("prefill-0", "prefill-1", "decode-0", "router"):
        assert any(
            line.split()[:1] == ["step"] and instance in line.split()
            for line in status.stdout.splitlines()
        ), status.stdout
    assert "decode-0 (2 nodes)" in status.stdout
    doctor = pdkit(cluster, "doctor", str(topology))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_a_step_cancelled_from_outside_is_noticed_and_started_again(cluster, topology):
    job = job_id(topology)
    steps = slurm(cluster, "squeue", "-h", "-s", "-j", job, "-o", "%i %j").split("\n")
    (step,) = [line.split()[0] for line in steps if line.endswith(" prefill-0")]
    slurm(cluster, "scancel", step)
    deadline = time.monotonic() + 60
    while True:
        status = pdkit(cluster, "status", str(topology))
        text = status.stdout
        # Until the router, too, sees it healthy again: the next test's load goes through it.
        healthy = "prefill 2/2 healthy" in text and "all healthy" in text
        if "prefill-0 started again by the job 1 time(s)" in text and healthy:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.5)
    assert step not in text  # a new step serves it


def test_a_restart_under_load_fails_no_request(cluster, topology, tmp_path):
    bench_args = ["bench", str(topology), "--rate", "4", "--duration", "10", "--requests", "40"]
    bench_args += ["--output-len", "16", "--no-predict", "--json", "--out", str(tmp_path)]
    env = {**os.environ, **cluster.env()}
    bench = subprocess.Popen(
        [sys.executable, "-c", "from kit.cli import main; main()", *bench_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        restart = pdkit(cluster, "restart", str(topology), "prefill-1")
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert "prefill-1: routed to again" in restart.stdout
        output, _ = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, output
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) >= 20 and [r for r in records if not r["ok"]] == []


def test_a_changed_count_adds_and_removes_steps_within_the_allocation(cluster, topology):
    job = job_id(topology)
    original = topology.read_text()

    def up_with(prefills: int, *flags: str):
        data = yaml.safe_load(original)
        data["prefill"]["count"] = prefills
        topology.write_text(yaml.safe_dump(data, sort_keys=False))
        return pdkit(cluster, "up", str(topology), *flags)

    def step_names() -> list[str]:
        return slurm(cluster, "squeue", "-h", "-s", "-j", job, "-o", "%j").split()

    try:
        diff = up_with(1, "--diff")
        assert diff.returncode == 0, diff.stdout + diff.stderr
        assert f"Job {job}: removing prefill-1. Nothing was changed (--diff)." in diff.stdout
        assert "prefill-1" in step_names()
        fewer = up_with(1)
        assert fewer.returncode == 0, fewer.stdout + fewer.stderr
        assert f"job {job} changes live: removing prefill-1" in fewer.stdout
        assert "prefill-1" not in step_names()
        # The router's step starts again with the list of the last change.
        restart = pdkit(cluster, "restart", str(topology), "router")
        assert restart.returncode == 0, restart.stdout + restart.stderr
        status = pdkit(cluster, "status", str(topology))
        assert "prefill 1/1 healthy" in status.stdout, status.stdout
        more = up_with(2)
        assert more.returncode == 0, more.stdout + more.stderr
        assert f"job {job} changes live: adding prefill-1" in more.stdout
        assert "prefill-1: routed to" in more.stdout and "2 of 2 pair(s) moved KV" in more.stdout
        assert "prefill-1" in step_names()
        too_many = up_with(3)
        assert too_many.returncode == 1
        assert "that allocation has no room for these instances" in too_many.stderr
        assert f"{job} pdkit-{NAME} RUNNING" in slurm(cluster, "squeue", "-h", "-o", "%i %j %T")
    finally:
        topology.write_text(original)
    client = OpenAI(base_url=f"{router_url(topology)}/v1", api_key="none", timeout=30)
    for _ in range(4):  # both prefills serve
        reply = client.completions.create(model="llama-3.1-8b", prompt="Hi", max_tokens=4)
        assert reply.choices[0].text


def test_down_leaves_no_job_step_or_process(cluster, topology):
    job = job_id(topology)
    down = pdkit(cluster, "down", str(topology))
    assert down.returncode == 0, down.stdout + down.stderr
    queue = slurm(cluster, "squeue", "-h", "-s", "-o", "%i").split()
    assert [step for step in queue if step.split(".")[0] == job] == []
    left = {}
    for node in NODES:
        pids = subprocess.run(
            ["ip", "netns", "pids", f"{NETNS_PREFIX}{node}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.split()
        commands = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids]
        left[node] = sorted(c for c in commands if c != "slurmd")
    assert left == {node: [] for node in NODES}
    assert f"job {job} is gone" in down.stdout
