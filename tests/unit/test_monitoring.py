"""Topology `monitoring:` -> the Plan's Prometheus, its scrape configuration, its checks, its
inventory record and what `pdkit render` shows."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from kit.errors import TopologyError
from kit.hosts.inventory import build_inventory, deploy_hosts
from kit.hosts.provision import provision_vars
from kit.plan.monitoring import prometheus_config
from kit.plan.resolve import resolve
from kit.plan.shell import plan_to_shell
from tests.conftest import REPO, base_topology
from tests.support.requires import require_command


def with_monitoring(**monitoring: object) -> dict:
    data = base_topology()
    data["monitoring"] = dict(monitoring)
    return data


def scrape_targets(plan) -> dict[str, list[tuple[str, str]]]:
    config = yaml.safe_load(prometheus_config(plan.monitoring, plan.name))
    return {
        job["job_name"]: [
            (target, group["labels"]["process"])
            for group in job["static_configs"]
            for target in group["targets"]
        ]
        for job in config["scrape_configs"]
    }


def test_monitoring_is_off_unless_the_topology_asks(write_topology):
    plan = resolve(write_topology(base_topology()))
    assert plan.monitoring is None
    assert "prometheus" not in plan_to_shell(plan)
    assert "prometheus" not in plan.process_names


def test_prometheus_scrapes_the_router_every_worker_and_itself(write_topology):
    plan = resolve(write_topology(with_monitoring()))
    monitoring = plan.monitoring
    assert monitoring is not None and monitoring.host == "a"  # the router's host by default
    assert monitoring.url == "http://10.0.0.1:9090"
    assert scrape_targets(plan) == {
        "router": [("10.0.0.1:8000", "router")],
        "prefill": [("10.0.0.1:30000", "prefill-0"), ("10.0.0.1:30001", "prefill-1")],
        "decode": [("10.0.0.2:30100", "decode-0")],
        "prometheus": [("10.0.0.1:9090", "prometheus")],
    }
    assert plan.process_names[-1] == "prometheus"
    argv = monitoring.command.argv()
    assert argv[0] == "prometheus"
    assert "--storage.tsdb.path" in argv and monitoring.data_dir in argv
    assert monitoring.data_dir == "/var/lib/pdkit/t/prometheus"
    assert monitoring.config_path == "/etc/pdkit/t/prometheus.yml"


def test_smg_is_scraped_on_its_metrics_port_and_node_exporters_when_asked(write_topology):
    data = with_monitoring(host="b", port=9191, node_exporter_port=9100, scrape_interval_s=2.5)
    data["router"] = {"host": "a", "kind": "smg", "metrics_port": 29001}
    plan = resolve(write_topology(data))
    targets = scrape_targets(plan)
    assert targets["router"] == [("10.0.0.1:29001", "router")]
    assert targets["node"] == [("10.0.0.1:9100", "node"), ("10.0.0.2:9100", "node")]
    assert targets["prometheus"] == [("10.0.0.2:9191", "prometheus")]
    config = yaml.safe_load(prometheus_config(plan.monitoring, plan.name))
    assert config["global"]["scrape_interval"] == "2500ms"


def test_prometheus_own_checker_accepts_the_configuration(write_topology, tmp_path):
    require_command("promtool", "prometheus")
    plan = resolve(write_topology(with_monitoring(node_exporter_port=9100)))
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus_config(plan.monitoring, plan.name))
    done = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_render_shows_prometheus_and_its_configuration(write_topology):
    text = plan_to_shell(resolve(write_topology(with_monitoring())))
    assert "# prometheus (monitoring): :9090, 5 targets every 5 s" in text
    assert "## /etc/pdkit/t/prometheus.yml on a" in text
    assert "  - targets: ['10.0.0.2:30100']" in text


def test_an_unknown_host_and_a_taken_port_are_refused(write_topology):
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(with_monitoring(host="c")))
    (problem,) = info.value.problems
    assert problem.key == "monitoring.host" and "no host named 'c'" in str(problem)
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(with_monitoring(port=8000)))
    (problem,) = info.value.problems
    assert problem.key == "monitoring.port"
    assert "used by both the router and Prometheus" in str(problem)


def test_prometheus_on_another_host_needs_workers_it_can_reach(write_topology):
    data = base_topology()
    data["decode"]["hosts"] = ["a"]  # everything on a, bound to loopback
    data["prefill"]["bind"] = data["decode"]["bind"] = "127.0.0.1"
    resolve(write_topology(data))
    data["monitoring"] = {"host": "b"}  # but Prometheus on b
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    assert {p.key for p in info.value.problems} == {"prefill.bind", "decode.bind"}
    assert all("b cannot reach" in str(p) for p in info.value.problems)


def test_the_inventory_runs_prometheus_on_its_host_with_its_files(write_topology):
    plan = resolve(write_topology(with_monitoring(host="b")))
    inventory = build_inventory(plan, deploy_hosts(plan, "/venv/bin/python"))
    children = inventory["all"]["children"]
    assert set(children["pdkit_monitoring"]["hosts"]) == {"b"}
    records = children["pdkit_hosts"]["hosts"]["b"]["pdkit_processes"]
    (record,) = [r for r in records if r["stage"] == "monitoring"]
    assert record["name"] == "prometheus" and record["executable"] == "prometheus"
    assert record["unit"] == "pdkit-t-prometheus.service"
    (config,) = record["files"]
    assert config["path"] == "/etc/pdkit/t/prometheus.yml"
    assert config["content"] == prometheus_config(plan.monitoring, plan.name)
    assert record["directories"] == [{"path": "/var/lib/pdkit/t/prometheus", "mode": "0755"}]
    assert all(r["files"] == [] for r in records if r["stage"] != "monitoring")
    assert re.match(children["pdkit_hosts"]["hosts"]["b"]["pdkit_unit_pattern"], record["unit"])


def test_provisioning_installs_prometheus_on_its_host_only(write_topology):
    plan = resolve(write_topology(with_monitoring(host="b")))
    wanted = {
        host.name: provision_vars(plan, host, pdkit_wheel_path=None, wheelhouse_archive=None)[
            "pdkit_base_monitoring"
        ]
        for host in deploy_hosts(plan, "/venv/bin/python")
    }
    assert wanted == {"a": False, "b": True}


def test_every_node_of_a_multi_node_instance_is_scraped_labelled_with_its_rank(write_topology):
    """SGLang's ranks >= 1 serve /metrics on their own --port: Prometheus scrapes each node,
    all under the instance's `process` label, told apart by `node_rank`."""
    data = yaml.safe_load((REPO / "topologies/deepseek-v3-2p2d.yaml").read_text())
    data["monitoring"] = {}
    plan = resolve(write_topology(data))
    config = yaml.safe_load(prometheus_config(plan.monitoring, plan.name))
    prefill = next(j for j in config["scrape_configs"] if j["job_name"] == "prefill")
    scraped = [(g["targets"][0], g["labels"]) for g in prefill["static_configs"]]
    nodes = [w for w in plan.workers if w.role == "prefill"]
    assert [target for target, _ in scraped] == [f"{w.address}:{w.http_port}" for w in nodes]
    assert [(labels["process"], labels["node_rank"]) for _, labels in scraped] == [
        ("prefill-0", "0"),
        ("prefill-0", "1"),
    ]
