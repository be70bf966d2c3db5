"""The router's replicas behind a virtual IP (router.hosts, router.vip): keepalived's
configuration per router host, rendered in the Plan, handed to provisioning by the inventory;
bad settings told before any host is touched."""

from __future__ import annotations

import pytest

from kit.deploy.state import build_record
from kit.errors import TopologyError
from kit.hosts.inventory import build_inventory, deploy_hosts
from kit.plan.resolve import resolve
from tests.conftest import base_topology

VIP = {"address": "10.0.0.100/24", "interface": "eth0", "virtual_router_id": 42}


def replicas_topology() -> dict:
    data = base_topology()
    data["router"] = {"hosts": ["a", "b"], "vip": dict(VIP)}
    return data


def test_each_router_host_gets_keepalived_with_the_first_one_preferred(write_topology):
    plan = resolve(write_topology(replicas_topology()))
    vip = plan.router_vip
    assert vip is not None and vip.ip == "10.0.0.100" and plan.router_hosts == ("a", "b")
    first, second = vip.replicas
    assert (first.host, second.host) == ("a", "b") and first.priority > second.priority
    assert first.config_path == "/etc/keepalived/keepalived.conf"
    conf = first.config
    assert "    state MASTER\n" in conf and "    state BACKUP\n" in second.config
    assert "    virtual_router_id 42\n" in conf and "    interface eth0\n" in conf
    assert "    unicast_src_ip 10.0.0.1\n" in conf
    assert "    unicast_peer {\n        10.0.0.2\n    }\n" in conf  # the other replica only
    assert "        10.0.0.100/24 dev eth0\n" in conf
    # The health check: the local router's /health, failing twice gives the address away.
    assert 'script "/usr/bin/curl -fsS -m 1 -o /dev/null http://127.0.0.1:8000/health"' in conf
    assert "    fall 2\n" in conf and "track_script {\n        pdkit_t_router\n" in conf
    assert plan.router.host == "a"  # the first replica


def test_the_inventory_gives_each_replica_its_file_and_groups_them(write_topology):
    plan = resolve(write_topology(replicas_topology()))
    inventory = build_inventory(plan, deploy_hosts(plan, "/usr/bin/python3"))
    groups = inventory["all"]["children"]
    assert set(groups["pdkit_router_vip"]["hosts"]) == {"a", "b"}
    hosts = groups["pdkit_hosts"]["hosts"]
    for replica in plan.router_vip.replicas:
        assert hosts[replica.host]["pdkit_keepalived_config"] == {
            "path": replica.config_path,
            "content": replica.config,
            "run_dir": "/run/pdkit/t",
        }


def test_without_a_vip_nothing_of_keepalived_is_rendered(write_topology):
    plan = resolve(write_topology(base_topology()))
    assert plan.router_vip is None and plan.router_hosts == ()
    inventory = build_inventory(plan, deploy_hosts(plan, "/usr/bin/python3"))
    assert inventory["all"]["children"]["pdkit_router_vip"]["hosts"] == {}


def test_a_tls_router_is_checked_over_https(write_topology):
    data = replicas_topology()
    data["router"]["tls"] = {"cert_file": "/etc/lb.crt", "key_file": "/etc/lb.key"}
    conf = resolve(write_topology(data)).router_vip.replicas[0].config
    assert "curl -fsS -k -m 1 -o /dev/null https://127.0.0.1:8000/health" in conf


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r.update(host="a"), "set host .* or hosts .*, not both"),
        (lambda r: r.update(hosts=["a", "c"]), "no host named 'c'"),
        (lambda r: r.update(hosts=["a", "a"]), "each host once"),
        (lambda r: r.pop("hosts"), "list the router's replicas in hosts"),
        (lambda r: r["vip"].update(address="10.0.0.100"), "needs its prefix length"),
        (lambda r: r["vip"].update(address="nowhere/24"), "not an address"),
        (lambda r: r.update(bind="10.0.0.1"), "cannot answer on the VIP"),
    ],
)
def test_bad_replica_settings_are_told(write_topology, change, expected):
    data = replicas_topology()
    change(data["router"])
    with pytest.raises(TopologyError, match=expected):
        resolve(write_topology(data))


def test_replicas_need_ip_addresses_for_vrrp(write_topology):
    data = replicas_topology()
    data["hosts"][1]["address"] = "node-b.example"
    with pytest.raises(TopologyError, match="keepalived sends its VRRP adverts between IP"):
        resolve(write_topology(data))


def test_every_replica_runs_the_router_and_the_later_ones_restart_for_a_new_worker_list(
    write_topology,
):
    plan = resolve(write_topology(replicas_topology()))
    inventory = build_inventory(plan, deploy_hosts(plan, "/usr/bin/python3"))
    groups = inventory["all"]["children"]
    assert set(groups["pdkit_router"]["hosts"]) == {"a", "b"}
    hosts = groups["pdkit_hosts"]["hosts"]
    (first,) = [r for r in hosts["a"]["pdkit_processes"] if r["role"] == "router"]
    (second,) = [r for r in hosts["b"]["pdkit_processes"] if r["role"] == "router"]
    assert first["args"] == second["args"]
    assert "restart_key" in first and "restart_key" not in second
    assert second["url"] == "http://10.0.0.2:8000"
    assert plan.runs_router("b") and not resolve(
        write_topology(base_topology(), "one.yaml")
    ).runs_router("b")


def test_the_deployment_record_keeps_the_first_replica_s_router(write_topology):
    plan = resolve(write_topology(replicas_topology()))
    record = build_record(plan, deploy_hosts(plan, "/usr/bin/python3"), "t")
    (router,) = [p for p in record.processes if p.role == "router"]
    assert router.host == "a" and router.url == plan.router.url
