"""Router replicas (router.hosts) and the VIP (router.vip) in status and health: each replica
up or down with its processes, the VIP's holder told from /health's `started`, a replica or
VIP that does not answer named with its fix."""

from __future__ import annotations

import dataclasses
import io
import json

from rich.console import Console

from kit.observe.probe import Fetched, ReplicaAnswers
from kit.observe.report import build_report, report_to_json
from kit.observe.targets import ReplicaTarget, targets_from_plan
from kit.observe.view import health_lines, status_view
from kit.plan.resolve import resolve
from tests.conftest import base_topology
from tests.support.observe_builders import cluster

A, B, VIP = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.100:8000"
LOG = "/var/log/pdkit/t/router.log"
PROCESSES = {"processes": [{"pid": 11, "running": True}, {"pid": 12, "running": True}]}


def got(url: str, body: object, status: int = 200) -> Fetched:
    return Fetched(url, status, json.dumps(body))


def refused(url: str) -> Fetched:
    return Fetched(url, failure="refused", detail="connection refused")


def replica(host: str, url: str, started: float, *, down: bool = False) -> ReplicaAnswers:
    if down:
        return ReplicaAnswers(host, url, refused(url + "/health"), refused(url + "/readiness"))
    health = got(url + "/health", {"status": "ok", "started": started})
    return ReplicaAnswers(host, url, health, got(url + "/readiness", {"ready": True, **PROCESSES}))


def report(b_down: bool = False, vip: Fetched | None = None):
    targets, now = cluster()
    targets = dataclasses.replace(
        targets,
        replicas=(ReplicaTarget("a", A, LOG), ReplicaTarget("b", B, LOG)),
        vip_url=VIP,
    )
    answers = (replica("a", A, 1000.5), replica("b", B, 2000.25, down=b_down))
    vip = vip or got(VIP + "/health", {"status": "ok", "started": 1000.5})
    return build_report(targets, dataclasses.replace(now, replicas=answers, vip=vip), timeout_s=3.0)


def screen(rep) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(status_view(rep))
    return console.file.getvalue()


def test_status_lists_each_replica_its_processes_and_the_vip_s_holder():
    rep = report()
    assert rep.healthy
    text = screen(rep)
    assert "router replica on a (10.0.0.1:8000): up, 2/2 processes, holds the VIP" in text
    assert "router replica on b (10.0.0.2:8000): up, 2/2 processes\n" in text
    assert "router VIP 10.0.0.100:8000: answers, held by a" in text
    assert health_lines(rep)[0] == (
        "OK: demo: 3 workers and the pdkit router (2 replicas) are healthy, its VIP "
        "10.0.0.100:8000 answers"
    )
    assert report_to_json(rep)["vip"]["holder"] == "a"


def test_a_down_replica_is_a_problem_with_its_fix_and_the_vip_moved_to_the_other():
    rep = report(b_down=False, vip=got(VIP + "/health", {"status": "ok", "started": 2000.25}))
    assert "held by b" in screen(rep)
    rep = report(b_down=True)
    (problem,) = [str(p) for p in rep.problems]
    assert problem == (
        "router@b (10.0.0.2:8000): router replica down (connection refused): the VIP has no "
        f"standby. To fix: read {LOG} on b, then `pdkit up` starts it again"
    )


def test_a_vip_that_does_not_answer_is_a_problem_naming_keepalived():
    rep = report(vip=refused(VIP + "/health"))
    (problem,) = [str(p) for p in rep.problems]
    assert problem.startswith(
        "router VIP (10.0.0.100:8000): does not answer (connection refused); replicas a, b "
        "answer, so keepalived holds it nowhere they are. To fix: on each router host, "
        "`systemctl status keepalived`"
    )
    assert "router VIP 10.0.0.100:8000: does not answer" in screen(rep)


def test_the_targets_of_a_plan_with_replicas_name_each_and_the_vip(write_topology):
    data = base_topology()
    data["router"] = {
        "hosts": ["a", "b"],
        "vip": {"address": "10.0.0.100/24", "interface": "eth0", "virtual_router_id": 42},
    }
    targets = targets_from_plan(resolve(write_topology(data)))
    assert [(r.host, r.url) for r in targets.replicas] == [("a", A), ("b", B)]
    assert targets.vip_url == VIP
    single = targets_from_plan(resolve(write_topology(base_topology(), "one.yaml")))
    assert single.replicas == () and single.vip_url is None
