"""Plan -> Ansible inventory: groups, connection, layout, process records, and no secrets."""

from __future__ import annotations

import json
import re

import pytest

from kit.hosts.inventory import (
    CONTROL_ROUTER_ADMIN_KEY_ENV,
    CONTROL_ROUTER_KEY_ENV,
    build_inventory,
    deploy_hosts,
)
from kit.plan.resolve import resolve
from tests.conftest import REPO

LOCAL = REPO / "topologies" / "local.yaml"
PYTHON = "/venv/bin/python"


def local_inventory():
    plan = resolve(LOCAL)
    return plan, build_inventory(plan, deploy_hosts(plan, PYTHON))


def test_local_default_runs_on_this_machine_with_the_control_venv():
    _, inventory = local_inventory()
    host = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["localhost"]
    assert host["ansible_connection"] == "local"
    assert host["ansible_python_interpreter"] == PYTHON
    assert host["pdkit_python"] == PYTHON
    assert host["ansible_become"] is False
    assert host["pdkit_service_manager"] == "supervisord"
    assert host["pdkit_root"] == str(REPO / "topologies" / ".pdkit" / "local" / "root")
    assert host["pdkit_log_dir"] == host["pdkit_root"] + "/var/log/pdkit/local"


def test_groups_name_worker_and_router_hosts():
    _, inventory = local_inventory()
    children = inventory["all"]["children"]
    assert inventory["all"]["vars"] == {"pdkit_deployment": "local", "pdkit_engine": "sim"}
    assert set(children["pdkit_workers"]["hosts"]) == {"localhost"}
    assert set(children["pdkit_router"]["hosts"]) == {"localhost"}


def test_each_process_gets_a_record_with_its_command_and_identity():
    plan, inventory = local_inventory()
    records = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["localhost"]["pdkit_processes"]
    assert [r["name"] for r in records] == ["prefill-0", "prefill-1", "decode-0", "router"]
    assert [r["stage"] for r in records] == ["workers"] * 3 + ["router"]
    decode = records[2]
    assert decode["module"] == "kit.sim"
    assert decode["args"] == list(plan.workers[2].command.args)
    assert decode["env"]["PDKIT_DEPLOYMENT"] == "local"
    assert decode["env"]["PDKIT_PROCESS"] == "decode-0"
    assert list(decode["env"]) == sorted(decode["env"])
    assert records[3]["module"] == "kit.lb"
    assert records[3]["secret_env"] == {"PDKIT_LB_ADMIN_KEY": CONTROL_ROUTER_ADMIN_KEY_ENV}


def test_records_carry_every_name_and_path_the_playbooks_use():
    plan, inventory = local_inventory()
    host = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["localhost"]
    decode = host["pdkit_processes"][2]
    root = host["pdkit_root"]
    assert decode["unit"] == plan.workers[2].unit == "pdkit-local-decode-0.service"
    assert decode["log_tag"] == "pdkit-local-decode-0"
    assert (
        decode["log_file"] == plan.workers[2].log_path == f"{root}/var/log/pdkit/local/decode-0.log"
    )
    assert decode["env_file"] == f"{root}/etc/pdkit/local/decode-0.env"
    assert decode["launch_script"] == f"{root}/opt/pdkit/local/bin/decode-0.sh"
    assert decode["program_conf"] == f"{root}/etc/pdkit/local/supervisord.d/decode-0.conf"
    units = [r["unit"] for r in host["pdkit_processes"]]
    assert all(re.match(host["pdkit_unit_pattern"], unit) for unit in units)
    assert not re.match(host["pdkit_unit_pattern"], "pdkit-local2-decode-0.service")


def test_the_inventory_is_deterministic():
    assert json.dumps(local_inventory()[1]) == json.dumps(local_inventory()[1])


@pytest.fixture
def remote_plan(write_topology):
    data = {
        "name": "prod",
        "engine": "sim",
        "model": {"path": "m"},
        "hosts": [
            {
                "name": "a",
                "address": "10.0.0.1",
                "gpus": 1,
                "ssh": {"user": "ops", "port": 2222, "key": "~/.ssh/pdkit"},
            },
            {
                "name": "b",
                "address": "10.0.0.2",
                "gpus": 1,
                "root": "/srv/b",
                "service_manager": "supervisord",
            },
        ],
        "prefill": {"hosts": ["a"]},
        "decode": {"hosts": ["b"]},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"host": "b", "kind": "smg", "api_key_env": "MY_KEY"},
    }
    path = write_topology(data)
    return path, resolve(path)


def test_ssh_hosts_get_connection_settings_and_a_venv_under_their_root(remote_plan):
    _, plan = remote_plan
    hosts = build_inventory(plan, deploy_hosts(plan, PYTHON))["all"]["children"]
    a = hosts["pdkit_hosts"]["hosts"]["a"]
    b = hosts["pdkit_hosts"]["hosts"]["b"]
    assert (a["ansible_host"], a["ansible_user"], a["ansible_port"]) == ("10.0.0.1", "ops", 2222)
    assert a["ansible_ssh_private_key_file"] == "~/.ssh/pdkit"
    assert a["ansible_become"] is True  # non-root user, systemd under /
    assert b["ansible_become"] is False  # root
    assert a["pdkit_python"] == "/opt/pdkit/venv/bin/python"
    assert b["pdkit_python"] == "/srv/b/opt/pdkit/venv/bin/python"
    assert set(hosts["pdkit_workers"]["hosts"]) == {"a", "b"}
    assert set(hosts["pdkit_router"]["hosts"]) == {"b"}


def test_the_router_key_is_named_never_included(remote_plan, monkeypatch):
    _, plan = remote_plan
    monkeypatch.setenv("MY_KEY", "sekret-value")
    inventory = build_inventory(plan, deploy_hosts(plan, PYTHON))
    router = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["b"]["pdkit_processes"][-1]
    assert router["secret_env"] == {"PDKIT_ROUTER_API_KEY": CONTROL_ROUTER_KEY_ENV}
    assert router["secret_args"] == [["--api-key", "PDKIT_ROUTER_API_KEY"]]
    assert "sekret-value" not in json.dumps(inventory)


def test_pdkit_router_key_goes_to_its_own_variable(write_topology):
    data = json.loads(
        json.dumps(
            {
                "name": "k",
                "engine": "sim",
                "model": {"path": "m"},
                "hosts": [
                    {
                        "name": "h",
                        "address": "127.0.0.1",
                        "gpus": 2,
                        "connection": "local",
                        "service_manager": "supervisord",
                        "root": "r",
                    }
                ],
                "transfer": {"backend": "mooncake_tcp"},
                "router": {"api_key_file": "key.txt"},
            }
        )
    )
    path = write_topology(data)
    plan = resolve(path)
    inventory = build_inventory(plan, deploy_hosts(plan, PYTHON))
    router = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["h"]["pdkit_processes"][-1]
    assert router["secret_env"] == {
        "PDKIT_LB_API_KEY": CONTROL_ROUTER_KEY_ENV,
        "PDKIT_LB_ADMIN_KEY": CONTROL_ROUTER_ADMIN_KEY_ENV,
    }


def test_sglang_workers_look_for_weights_where_provisioning_put_them(write_topology):
    data = {
        "name": "real",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [
            {
                "name": "a",
                "address": "10.0.0.1",
                "gpus": 2,
                "root": "/srv/a",
                "rdma_devices": ["mlx5_0"],
            }
        ],
    }
    path = write_topology(data)
    plan = resolve(path)
    hosts = build_inventory(plan, deploy_hosts(plan, PYTHON))["all"]["children"]
    records = hosts["pdkit_hosts"]["hosts"]["a"]["pdkit_processes"]
    workers = [r for r in records if r["role"] != "router"]
    assert {r["env"]["HF_HOME"] for r in workers} == {"/srv/a/var/lib/pdkit/huggingface"}
    assert "HF_HOME" not in next(r for r in records if r["role"] == "router")["env"]


def test_each_rank_of_a_multi_node_instance_runs_under_its_group_agent():
    """The ranks of a multi-node instance name their group's leader (node rank 0's host, at its
    dist-init port + 40); single-node instances run their command alone."""
    plan = resolve(REPO / "topologies" / "deepseek-v3-2p2d.yaml")
    inventory = build_inventory(plan, deploy_hosts(plan, PYTHON))
    records = {
        r["name"]: r
        for host in inventory["all"]["children"]["pdkit_hosts"]["hosts"].values()
        for r in host["pdkit_processes"]
        if r["stage"] == "workers"
    }
    multi = [w for w in plan.workers if w.nnodes > 1]
    assert multi
    for worker in multi:
        rank0 = next(
            w for w in plan.workers if w.instance_name == worker.instance_name and w.node_rank == 0
        )
        dist_init = next(u.first for u in rank0.ports if u.what.startswith("dist-init"))
        leader = f"{rank0.address}:{dist_init + 40}"
        assert records[worker.name]["rank_group"] == [
            "--leader",
            leader,
            "--node-rank",
            str(worker.node_rank),
            "--nnodes",
            str(worker.nnodes),
        ]
        if worker.node_rank == 0:
            assert [u.what for u in worker.ports].count("rank group") == 1
    _, local = local_inventory()
    local_records = local["all"]["children"]["pdkit_hosts"]["hosts"]["localhost"]["pdkit_processes"]
    assert all(r["rank_group"] is None for r in local_records if r["stage"] == "workers")
