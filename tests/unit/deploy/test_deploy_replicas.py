"""Router replicas (router.hosts) under `pdkit up`: changed one at a time, each gated on a new
image answering /readiness before the next is touched, the VIP holder last; readiness waits
and tables know every replica."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kit.bench.options import BenchArgs
from kit.bench.options import target as bench_target
from kit.deploy import DeployContext, UpOptions
from kit.deploy import live as live_module
from kit.deploy.changes import Changes
from kit.deploy.live import LiveChange
from kit.deploy.readiness import Verdict
from kit.deploy.replicas import rollout_order
from kit.deploy.state import build_record
from kit.deploy.wait import ProcessStatus, router_targets, vip_targets
from kit.errors import DeployError
from kit.plan.resolve import resolve
from tests.conftest import base_topology

VIP = {"address": "10.0.0.100/24", "interface": "eth0", "virtual_router_id": 42}


@pytest.fixture
def ctx(write_topology, tmp_path) -> DeployContext:
    data = base_topology()
    data["router"] = {"hosts": ["a", "b"], "vip": dict(VIP)}
    path = write_topology(data)
    return DeployContext.build(resolve(path), path, tmp_path / "state", "/venv/bin/python")


def test_the_backup_changes_first_and_every_replica_is_waited_for(ctx):
    plan = ctx.plan
    assert [(s.host, s.url) for s in rollout_order(plan)] == [
        ("b", "http://10.0.0.2:8000"),
        ("a", "http://10.0.0.1:8000"),
    ]
    targets = router_targets(plan)
    assert [(t.name, t.host, t.url, t.process_name) for t in targets] == [
        ("router", "a", "http://10.0.0.1:8000", "router"),
        ("router@b", "b", "http://10.0.0.2:8000", "router"),
    ]
    assert plan.client_url == "http://10.0.0.100:8000"


class Recorder:
    """What the rollout did, in order, with the replica that fails its gate (if any)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fails: str | None = None) -> None:
        self.events: list[tuple[str, ...]] = []
        self.fails = fails

        def run(live: LiveChange, playbook: str, tags: str | None, inventory: dict) -> None:
            groups = inventory["all"]["children"]
            hosts = groups["pdkit_hosts"]["hosts"]
            handed = [h for h in hosts if hosts[h].get("pdkit_process_hand_over")]
            self.events.append((playbook, *groups["pdkit_router"]["hosts"], *handed))

        def started(live: LiveChange, url: str | None = None) -> float:
            self.events.append(("started?", url or ""))
            return 1.0

        async def after(live: LiveChange, url: str, before: float, timeout: float) -> None:
            self.events.append(("new image", url))

        def wait(ctx, console, targets, timeout, headers) -> list[ProcessStatus]:
            (target,) = targets
            self.events.append(("ready?", target.host))
            state = "failed" if target.host == self.fails else "ready"
            return [ProcessStatus(target, Verdict(state, "exited"), 0.1)]

        monkeypatch.setattr(LiveChange, "_run", run)
        monkeypatch.setattr(LiveChange, "_router_started", started)
        monkeypatch.setattr(LiveChange, "_wait_started_after", after)
        monkeypatch.setattr(live_module, "wait_until_ready", wait)
        monkeypatch.setattr("kit.deploy.steps._log_tail", lambda ctx, name: [])


def live(ctx: DeployContext) -> LiveChange:
    target = build_record(ctx.plan, ctx.hosts, "t")
    return LiveChange(ctx, Console(file=io.StringIO(), width=200), UpOptions(), {}, target)


def test_a_changed_setting_hands_over_one_replica_then_the_next(ctx, monkeypatch):
    recorder = Recorder(monkeypatch)
    live(ctx)._router(Changes("t", False, router=("restart",)))
    b, a = "http://10.0.0.2:8000", "http://10.0.0.1:8000"
    assert recorder.events == [
        ("started?", b),
        ("deploy.yml", "b", "b"),  # only b's router deployed, b handed over
        ("new image", b),
        ("ready?", "b"),
        ("started?", a),
        ("deploy.yml", "a", "a"),
        ("new image", a),
        ("ready?", "a"),
    ]


def test_a_replica_that_does_not_come_back_stops_the_rollout(ctx, monkeypatch):
    recorder = Recorder(monkeypatch, fails="b")
    with pytest.raises(DeployError) as failed:
        live(ctx)._router(Changes("t", False, router=("--retries 1 added",)))
    assert ("deploy.yml", "a") not in recorder.events  # a never touched
    message = str(failed.value)
    assert "replica 1/2 on b (http://10.0.0.2:8000): did not come back; a not touched" in message


def test_without_a_changed_setting_each_replica_is_deployed_and_waited_for_in_turn(
    ctx, monkeypatch
):
    recorder = Recorder(monkeypatch)
    live(ctx)._router(Changes("t", False))
    assert recorder.events == [
        ("deploy.yml", "b"),
        ("ready?", "b"),
        ("deploy.yml", "a"),
        ("ready?", "a"),
    ]


def test_bench_loads_the_vip_or_says_which_replica_it_hits(ctx, write_topology):
    target = bench_target(BenchArgs(), ctx.plan)
    assert target.url == "http://10.0.0.100:8000"
    assert target.via == "the router's VIP (replicas a, b)"
    data = base_topology()
    data["router"] = {"hosts": ["a", "b"]}  # a site's own balancer: no VIP
    target = bench_target(BenchArgs(), resolve(write_topology(data, "novip.yaml")))
    assert target.url == "http://10.0.0.1:8000"
    assert target.via == "the router replica on a (of a, b; no VIP)"


def test_up_waits_for_the_vip_after_the_replicas(ctx):
    (vip,) = vip_targets(ctx.plan)
    assert (vip.name, vip.url, vip.ready_path) == (
        "router VIP",
        "http://10.0.0.100:8000",
        "/health",
    )
