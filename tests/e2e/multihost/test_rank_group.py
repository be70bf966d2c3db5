"""A multi-node instance lives and dies as one (#35): on a bed of five namespace hosts, a sim
deployment whose two decodes each span two hosts (decode-0: rank 0 on b, rank 1 on c; decode-1
on d and e), the prefill and the router on a. Under `pdkit bench` load, node rank 1 of decode-0
is SIGKILLed: its group's agent stops rank 0 too and starts both again, rank 0 first, the router
ejects decode-0 meanwhile and readmits it once it is healthy, with no command from anyone; no
request fails (decode-1 takes them), and decode-1, the prefill and the router keep their PIDs.

Host a is provisioned from the session's wheelhouse (as test_provision_and_up.py does); the
other hosts' venvs are links to a's (a shared file system), so that one provisioning serves all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kit.hosts.context import load_context
from tests.support.local_deploy import end_bench, start_bench
from tests.support.multihost import (
    bed_hosts,
    bench_records,
    provision_shared_venv,
    require_testbed,
    run_pdkit,
)
from tests.support.netns import NetnsHost, TestBed
from tests.support.sim_launch import healthy


def _topology(bed: TestBed, folder: Path) -> Path:
    hosts = bed.hosts
    data = {
        "name": "ranks",
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
        "hosts": bed_hosts(bed, hosts),
        "prefill": {"count": 1, "hosts": ["a"]},
        "decode": {"count": 2, "tp": 2, "hosts": ["b", "c", "d", "e"]},
        "defaults": {"args": {"page-size": 16}},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"kind": "pdkit", "host": "a", "port": 8000, "bind": hosts[0].address},
    }
    path = folder / "ranks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def deployed(
    tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path
) -> Iterator[tuple[TestBed, Path]]:
    """The five-host bed, provisioned, with the deployment up; down and removed at the end."""
    require_testbed()
    base = Path(tmp_path_factory.mktemp("ranks"))
    bed = TestBed(base=base / "bed", names=("a", "b", "c", "d", "e")).create()
    try:
        topology = _topology(bed, base)
        started = time.monotonic()
        provision_shared_venv(bed, base, wheelhouse)
        print(f"pdkit provision: {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        up = run_pdkit(bed, "up", str(topology))
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"pdkit up: {time.monotonic() - started:.1f} s")
        yield bed, topology
        down = run_pdkit(bed, "down", str(topology), timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        bed.destroy()


def _ranks(host: NetnsHost) -> dict[int, str]:
    """The sim processes on `host` (ranks and single-node workers), not their agents."""
    return {
        pid: cmd
        for pid, cmd in host.processes().items()
        if "-m kit.sim" in cmd and "-m kit.ranks" not in cmd
    }


FAILURE_FIELDS = ("index", "warmup", "sent_s", "status", "error_kind", "error", "request_id")


def _failures(failed: list[dict[str, object]], router_log: Path) -> str:
    """The failed requests as the bench saw them, each with the router's access line for it,
    then the router's last lines that are not access lines (retries, migrations, ejections):
    what a failure under the restart needs to be understood from one run."""
    try:
        lines = router_log.read_text(errors="replace").splitlines()
    except OSError as exc:
        lines = [f"(no router log: {exc})"]
    out = [f"{len(failed)} failed"]
    for record in failed[:5]:
        out.append(json.dumps({key: record.get(key) for key in FAILURE_FIELDS}))
        request_id = str(record.get("request_id") or "")
        out += [line for line in lines if request_id and request_id in line][:3]
    out.append("the router's last other lines:")
    out += [line for line in lines if "access {" not in line][-40:]
    return "\n".join(out)


def test_the_only_multi_node_instance_started_as_one_group(deployed):
    bed, topology = deployed
    plan = load_context(topology).plan
    decode0 = [w for w in plan.workers if w.instance_name == "decode-0"]
    assert [(w.host, w.node_rank) for w in decode0] == [("b", 0), ("c", 1)]
    assert {w.rank_group_addr for w in decode0} == {f"{bed.host('b').address}:5540"}
    for name in "bcde":
        (command,) = _ranks(bed.host(name)).values()
        assert "--nnodes 2" in command


def test_a_killed_rank_brings_the_whole_instance_back_and_no_request_fails(deployed, tmp_path):
    bed, topology = deployed
    plan = load_context(topology).plan
    c = bed.host("c")
    others = {name: set(_ranks(bed.host(name))) for name in "ade"}
    before = {name: set(_ranks(bed.host(name))) for name in "bc"}
    decode0 = next(
        w.url for w in plan.workers if w.instance_name == "decode-0" and w.node_rank == 0
    )
    # Ended 2 s after decode-0 is back (as Ctrl-C does), the duration an upper bound.
    load = ["--rate", "4", "--duration", "60", "--requests", "240", "--output-len", "16"]
    bench = start_bench(topology, tmp_path, *load)
    try:
        time.sleep(4)  # load on both decodes first
        (rank1,) = before["c"]
        killed = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        down_at = None
        while time.monotonic() - killed < 60:
            up = healthy(decode0)
            if down_at is None and not up:
                down_at = time.monotonic()
            now = {name: set(_ranks(bed.host(name))) for name in "bc"}
            restarted = all(now[n] and not now[n] & before[n] for n in "bc")
            if down_at is not None and up and restarted:
                break
            time.sleep(0.2)
        back = time.monotonic() - killed
        assert down_at is not None, "decode-0 never went down"
        assert up and restarted, (now, before)
        print(f"decode-0 without serving: {back:.1f} s after the kill")
        output = end_bench(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, output
    records = bench_records(tmp_path)
    failed = [r for r in records if not r["ok"]]
    assert records and not failed, _failures(failed, Path(plan.router.log_path))
    # Only decode-0's two ranks were restarted, rank 0 on b as well as the killed rank 1 on c.
    assert {name: set(_ranks(bed.host(name))) for name in "ade"} == others
    rank0 = next(w for w in plan.workers if w.instance_name == "decode-0" and w.node_rank == 0)
    log = Path(rank0.log_path).read_text()
    # Why the group restarted names the rank whose end the leader heard of first: rank 1's
    # process or agent, or rank 0's own process (the sim, as SGLang, kills rank 0's process tree
    # with SIGKILL once a peer's link breaks, and on a loaded machine that can beat the report
    # from c's agent).
    why = r"generation \d+ ends: node rank [01]'s (process exited with -9|agent is gone)"
    assert re.search(why, log), log[-3000:]
    assert "generation 2: node rank 0 started" in log
    states = run_pdkit(bed, "status", str(topology), "--json", "--timeout", "2", timeout=60)
    report = json.loads(states.stdout.strip().splitlines()[-1])
    states = {w["name"]: w["state"] for w in report["workers"]}
    assert set(states.values()) == {"healthy"}, states
    assert len(states) == 5 and report["router"]["state"] == "healthy"
    assert c.processes()  # the agent on c kept running: only its rank was replaced
