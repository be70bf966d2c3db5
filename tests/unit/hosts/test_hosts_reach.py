"""The reachability preflight: which ports which host must reach (from the Plan's firewall
rules), the probe pair run on this machine (a listener and a connector), and what a failed
route prints. The firewall itself is on the multi-host bed (tests/e2e/multihost/test_preflight.py).
"""

from __future__ import annotations

import socket
import sys

import pytest

from kit.hosts import reach
from kit.hosts.context import load_context
from kit.hosts.hostcheck import reach_items
from kit.hosts.inventory import DeployHost
from kit.hosts.reach import Reach, Route, check_reach, failure_lines, routes
from tests.conftest import base_topology


def test_decode_hosts_reach_each_prefill_bootstrap_and_nodes_their_rank_0(write_topology):
    data = base_topology()
    data["hosts"].append({**data["hosts"][1], "name": "c", "address": "10.0.0.3"})
    data["prefill"] = {"count": 1, "tp": 8, "hosts": ["a"]}
    data["decode"] = {"count": 1, "tp": 16, "hosts": ["b", "c"]}
    ctx = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    prefill = ctx.plan.role("prefill")[0]
    lines = [r.line() for r in routes(ctx.plan)]
    assert lines == [
        f"b -> a (10.0.0.1) port {prefill.bootstrap_port} (prefill-0 bootstrap)",
        f"c -> a (10.0.0.1) port {prefill.bootstrap_port} (prefill-0 bootstrap)",
        "c -> b (10.0.0.2) port 5500 (decode-0-node0 dist-init)",
        "c -> b (10.0.0.2) port 5540 (decode-0-node0 rank group)",
    ]
    assert routes(ctx.plan)[2].bind == ctx.plan.role("decode")[0].bind


def test_a_host_reaching_itself_needs_no_probe(write_topology):
    data = base_topology()
    data["decode"]["hosts"] = ["a"]
    ctx = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    assert routes(ctx.plan) == []


def _route(port: int, address: str = "127.0.0.1") -> Route:
    return Route("b", "a", address, "127.0.0.1", port, "prefill-0", "bootstrap", "decode hosts")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_probes_report_a_port_reached_and_one_that_refuses(
    write_topology, monkeypatch: pytest.MonkeyPatch
):
    """Both probes on this machine: the listener binds 127.0.0.1, one route connects there,
    the other to 127.0.0.2 where nothing listens (refused, as a rejecting firewall does)."""
    ctx = load_context(write_topology(base_topology()), control_python="/ctl/venv/bin/python")
    local = ctx.host("a")
    local = DeployHost(
        plan=local.plan.model_copy(update={"connection": "local"}),
        layout=local.layout,
        python=sys.executable,
    )
    good, bad = _free_port(), _free_port()
    todo = [_route(good), _route(bad, "127.0.0.2")]
    monkeypatch.setattr(reach, "routes", lambda plan: todo)
    results = check_reach(ctx.plan, {"a": local, "b": local}, connect_timeout_s=2.0)
    assert [(r.route.port, r.state) for r in results] == [(good, "ok"), (bad, "refused")]
    text = "\n".join(failure_lines(results))
    assert f"b -> a (127.0.0.2) port {bad} (prefill-0 bootstrap): refused" in text
    assert "Could not fetch prefill parallel info from bootstrap_addr" in text
    assert "To fix: the connection is rejected (a firewall, or a wrong address)" in text
    assert f"open TCP {bad} on a (127.0.0.2) to b" in text


def test_check_prints_one_item_per_source_host_naming_what_to_open():
    dropped = Reach(_route(8998, "10.0.0.1"), "timeout", "no answer within 3s")
    fine = Reach(_route(5000, "10.0.0.1"), "ok")
    [item] = reach_items([fine, dropped])
    assert (item.host, item.item, item.verdict) == ("b", "reachable ports", "fail")
    assert item.found == "a 8998 (prefill-0 bootstrap) timeout"
    assert (
        item.fix
        == "packets are dropped on the way (a firewall): open TCP 8998 on a (10.0.0.1) to b"
    )
    assert reach_items([fine])[0].verdict == "ok"
