"""The multi-host story on three namespace hosts reached over real SSH: a dry run on fresh
hosts (nothing changed), provision from a pushed wheelhouse (the hosts have no route to any
package index), provision again (no change, and Mooncake transfers between the worker hosts)
and in a dry run (clean), `pdkit up` with prefill on a, decode on b and the router on c (its
KV transfer gate passing), a chat completion whose KV crosses hosts over Mooncake TCP, a live
scale-up to two decodes and a rolling restart of them under `pdkit bench` load (no request
fails), `pdkit status` seeing all three and then the killed decode, a decode whose transfers are
refused failing `pdkit up` at the gate with the cause, and `pdkit down` leaving nothing
running.

The steps share one deployment and run in file order; a failed step fails the ones after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit.hosts.context import load_context
from tests.support.local_deploy import end_bench
from tests.support.multihost import bed_topology, run_pdkit
from tests.support.netns import TestBed


@pytest.fixture(scope="module")
def topology(testbed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = bed_topology(testbed, Path(tmp_path_factory.mktemp("multihost")))
    yield path
    run_pdkit(testbed, "down", str(path), timeout=120)


@pytest.fixture(scope="module")
def provisioned(testbed: TestBed, topology: Path, wheelhouse: Path) -> subprocess.CompletedProcess:
    # The hosts' OS packages are the machine's own (shared file system): check, don't install.
    return run_pdkit(
        testbed,
        "provision",
        str(topology),
        "--wheelhouse",
        str(wheelhouse),
        "-e",
        "pdkit_base_install_packages=false",
    )


def _status(testbed: TestBed, topology: Path) -> dict:
    result = run_pdkit(testbed, "status", str(topology), "--json", "--timeout", "2", timeout=60)
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _states(report: dict) -> dict[str, str]:
    states = {w["name"]: w["state"] for w in report["workers"]}
    states["router"] = report["router"]["state"]
    return states


def test_a_dry_run_on_fresh_hosts_says_what_would_change_and_changes_nothing(
    testbed, topology, wheelhouse
):
    check = run_pdkit(
        testbed,
        "provision",
        str(topology),
        "--dry-run",
        "--wheelhouse",
        str(wheelhouse),
        "-e",
        "pdkit_base_install_packages=false",
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "would change a, b, c" in check.stdout
    for host in testbed.hosts:
        assert list(host.root.iterdir()) == []


def test_provision_installs_a_venv_from_the_wheelhouse_on_every_host(
    testbed, topology, provisioned
):
    assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
    assert "changed a, b, c" in provisioned.stdout
    deploy_hosts = load_context(topology).hosts_by_name
    for host in testbed.hosts:
        # The venv's pdkit is the control machine's; the packages came from the pushed wheels.
        python = deploy_hosts[host.name].python
        assert python.startswith(f"{host.root}/")
        result = testbed.ssh(
            host,
            f"{python} -c 'import kit, mooncake.engine, supervisor; print(kit.__file__)'",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(str(host.root))
        limits = host.root / "etc/security/limits.d/90-pdkit-memlock.conf"
        assert "* hard memlock unlimited" in limits.read_text()


def test_a_second_provision_changes_nothing_and_a_dry_run_is_clean(
    testbed, topology, wheelhouse, provisioned
):
    assert provisioned.returncode == 0
    common = ["--wheelhouse", str(wheelhouse), "-e", "pdkit_base_install_packages=false"]
    again = run_pdkit(testbed, "provision", str(topology), *common, "--transfer-test")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "no change: already provisioned" in again.stdout
    # The transfer engine itself between the worker hosts a and b, both ways (TCP: no RDMA).
    assert re.search(r"a tcp -> b tcp: [\d.]+ GB/s", again.stdout), again.stdout
    assert re.search(r"b tcp -> a tcp: [\d.]+ GB/s", again.stdout), again.stdout
    check = run_pdkit(testbed, "provision", str(topology), "--dry-run", *common)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "nothing would change" in check.stdout


def test_up_serves_a_chat_completion_whose_kv_crosses_hosts(testbed, topology, provisioned):
    assert provisioned.returncode == 0
    up = run_pdkit(testbed, "up", str(topology))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "1 of 1 pair(s) moved KV (1 prefill x 1 decode)" in up.stdout  # the gate
    a, b, c = testbed.hosts
    deploy_hosts = load_context(topology).hosts_by_name
    # Each process runs in its own host's namespace, from that host's venv.
    for host, module in ((a, "kit.sim"), (b, "kit.sim"), (c, "kit.lb")):
        commands = host.processes().values()
        python = deploy_hosts[host.name].python
        assert any(f"{python} -m {module}" in cmd for cmd in commands), commands

    from openai import OpenAI  # noqa: PLC0415

    client = OpenAI(base_url=f"http://{c.address}:8000/v1", api_key="none", timeout=30)
    reply = client.chat.completions.create(
        model="llama-3.1-8b",
        messages=[{"role": "user", "content": "Say hello across hosts."}],
        max_tokens=8,
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    # The decode on b pulled the KV from the prefill on a: a TCP connection between the two
    # namespaces, to the transfer engine's RPC ports.
    connections = testbed.ssh(b, f"ss -tn state established dst {a.address}").stdout
    assert a.address in connections, connections


def _workers_pids(host) -> set[int]:
    return {pid for pid, cmd in host.processes().items() if "-m kit." in cmd}


def test_scale_up_and_rolling_restart_under_load_fail_no_request(testbed, topology, tmp_path):
    """`pdkit up` from 1P1D to 1P2D (decode-1 on b), then `pdkit restart ... decode` (one
    decode at a time) while `pdkit bench` sends requests: none fails, and the prefill on a and
    the router on c keep their PIDs. Then back to 1P1D (decode-1 drained and stopped)."""
    a, b, c = testbed.hosts
    kept = {host.name: _workers_pids(host) for host in (a, c)}
    original = topology.read_text()
    data = yaml.safe_load(original)
    data["hosts"][1]["gpus"] = 2
    data["decode"]["count"] = 2
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    bench_args = ["bench", str(topology), "--rate", "3", "--duration", "60", "--requests", "180"]
    bench_args += ["--output-len", "16", "--no-predict", "--json", "--out", str(tmp_path)]
    bench = subprocess.Popen(
        [sys.executable, "-c", "from kit.cli import main; main()", *bench_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        up = run_pdkit(testbed, "up", str(topology))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "1. add decode-1" in up.stdout and "Router: keeps running" in up.stdout
        restart = run_pdkit(testbed, "restart", str(topology), "decode")
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert "1. replace decode-0 (restart)\n  2. replace decode-1 (restart)" in restart.stdout
        output = end_bench(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, output
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert records and not [r for r in records if not r["ok"]]
    assert {r["decode"] for r in records} == {
        f"http://{b.address}:30100",
        f"http://{b.address}:30101",
    }
    assert {host.name: _workers_pids(host) for host in (a, c)} == kept

    topology.write_text(original)
    back = run_pdkit(testbed, "up", str(topology))
    assert back.returncode == 0, back.stdout + back.stderr
    assert "1. remove decode-1" in back.stdout
    assert len(_workers_pids(b)) == 1


def test_status_shows_all_three_then_the_killed_decode(testbed, topology):
    report = _status(testbed, topology)
    assert _states(report) == {"prefill-0": "healthy", "decode-0": "healthy", "router": "healthy"}
    b = testbed.host("b")
    decode = [pid for pid, cmd in b.processes().items() if "-m kit.sim" in cmd]
    assert len(decode) == 1
    os.kill(decode[0], signal.SIGTERM)  # exit 0: supervisord does not restart it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = _states(_status(testbed, topology))
        if states["decode-0"] == "down":
            break
        time.sleep(0.5)
    assert states["decode-0"] == "down"
    assert states["prefill-0"] == "healthy"


def test_a_decode_whose_transfers_are_refused_fails_up_at_the_gate(testbed, topology):
    """The decode's Mooncake port refuses (PDKIT_SIM_FAULT=refuse): `pdkit up` restarts it,
    then fails at the gate naming the pair and the cause, read from the prefill's log on a."""
    data = yaml.safe_load(topology.read_text())
    data["decode"]["env"] = {"PDKIT_SIM_FAULT": "refuse"}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    # The only decode is replaced with no free GPU for a stand-in: --force accepts the gap.
    up = run_pdkit(testbed, "up", str(topology), "--gate-timeout", "10", "--force")
    assert up.returncode == 1, up.stdout + up.stderr
    b = testbed.host("b")
    failed = "The KV transfer gate failed: of 1 prefill x decode pair(s), 1 did not move KV"
    assert failed in up.stderr
    assert "prefill-0 x decode-0: failed:" in up.stderr
    assert "cause (rpc_refused)" in up.stderr
    assert "prefill-0: E" in up.stderr  # the transfer engine's own line, from host a's log
    assert f"SocketHandShakePlugin: connect(){b.address}:1: Connection refused" in up.stderr
    assert "--no-gate" in up.stderr


def test_down_leaves_nothing_running_on_any_host(testbed, topology):
    down = run_pdkit(testbed, "down", str(topology))
    assert down.returncode == 0, down.stdout + down.stderr
    plan = load_context(topology).plan
    ports = {plan.router.port} | {w.http_port for w in plan.workers}
    ports |= {w.bootstrap_port for w in plan.workers if w.bootstrap_port}
    for host in testbed.hosts:
        assert host.processes() == {}, (host.name, host.processes())
        for port in ports:
            assert not host.listening(port)
