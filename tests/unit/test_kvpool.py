"""Topology `kv_pool:`: the master in the Plan, the workers' HiCache flags and MOONCAKE_*
environment, and each mistake refused with the key and the fix."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.hosts.inventory import build_inventory, deploy_hosts
from kit.plan.monitoring import prometheus_config
from kit.plan.resolve import resolve
from kit.plan.shell import plan_to_shell
from tests.conftest import base_topology


def with_pool(**pool: object) -> dict:
    data = base_topology()
    data["kv_pool"] = pool
    return data


def problem_at(write_topology, data: dict, key: str):
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    found = [p for p in info.value.problems if p.key == key]
    assert found, f"no problem at {key}: {[str(p) for p in info.value.problems]}"
    return found[0]


def test_no_pool_means_no_master_and_no_hicache_flags(write_topology):
    plan = resolve(write_topology(base_topology()))
    assert plan.kv_pool is None
    for worker in plan.workers:
        assert "--enable-hierarchical-cache" not in worker.command.args
        assert not any(k.startswith("MOONCAKE_") for k in worker.env)


def test_prefills_get_the_hicache_flags_and_the_store_environment(write_topology):
    plan = resolve(write_topology(with_pool(segment_gb=8)))
    prefill = plan.role("prefill")[0]
    args = prefill.command.args
    for flag, value in [
        ("--hicache-storage-backend", "mooncake"),
        ("--page-size", "64"),
        ("--hicache-mem-layout", "page_first"),
        ("--hicache-io-backend", "kernel"),
        ("--hicache-write-policy", "write_through"),
        ("--hicache-storage-prefetch-policy", "timeout"),
    ]:
        assert args[args.index(flag) + 1] == value
    assert "--enable-hierarchical-cache" in args
    assert prefill.env["MOONCAKE_MASTER"] == "10.0.0.1:50051"  # the router's host by default
    assert prefill.env["MOONCAKE_TE_META_DATA_SERVER"] == "http://10.0.0.1:8080/metadata"
    assert prefill.env["MOONCAKE_PROTOCOL"] == "rdma"
    assert prefill.env["MOONCAKE_DEVICE"] == ",".join(f"mlx5_{i}" for i in range(8))
    assert prefill.env["MOONCAKE_LOCAL_HOSTNAME"] == "10.0.0.1"
    # Two prefills on host a share its 8 GiB.
    assert prefill.env["MOONCAKE_GLOBAL_SEGMENT_SIZE"] == str(4 << 30)
    decode = plan.role("decode")[0]
    assert decode.command.args[decode.command.args.index("--page-size") + 1] == "64"
    assert "--hicache-storage-backend" not in decode.command.args
    assert "MOONCAKE_MASTER" not in decode.env
    assert plan.kv_pool is not None
    assert plan.kv_pool.clients == ("prefill-0", "prefill-1")
    assert plan.kv_pool.capacity_bytes == 8 << 30


def test_decode_offload_makes_the_decodes_clients_too(write_topology):
    plan = resolve(write_topology(with_pool(roles={"decode_offload": True})))
    decode = plan.role("decode")[0]
    assert "--disaggregation-decode-enable-offload-kvcache" in decode.command.args
    assert "--enable-hierarchical-cache" not in decode.command.args
    assert decode.env["MOONCAKE_MASTER"] == "10.0.0.1:50051"
    assert plan.kv_pool is not None and "decode-0" in plan.kv_pool.clients


def test_the_master_starts_first_with_its_metadata_server_embedded(write_topology):
    plan = resolve(write_topology(with_pool(host="b", rpc_port=50060, metrics_port=9010)))
    master = plan.kv_pool
    assert master is not None
    assert plan.process_names[0] == "kv-pool" and master.host == "b"
    assert master.command.module == "mooncake.cli"
    assert "--rpc_port=50060" in master.command.args
    assert "--enable_http_metadata_server=true" in master.command.args
    assert master.url == "http://10.0.0.2:9010"
    text = plan_to_shell(plan)
    assert "# kv-pool (Mooncake Store master)" in text and "python -m mooncake.cli" in text


def test_a_metadata_server_elsewhere_is_used_not_deployed(write_topology):
    url = "http://10.0.0.9:8080/metadata"
    plan = resolve(write_topology(with_pool(metadata_server=url)))
    assert plan.kv_pool is not None and plan.kv_pool.metadata_port is None
    assert "--enable_http_metadata_server=true" not in plan.kv_pool.command.args
    assert plan.role("prefill")[0].env["MOONCAKE_TE_META_DATA_SERVER"] == url


def test_the_inventory_and_prometheus_know_the_master(write_topology):
    data = with_pool()
    data["monitoring"] = {}
    plan = resolve(write_topology(data))
    inventory = build_inventory(plan, deploy_hosts(plan, "/usr/bin/python3"))
    groups = inventory["all"]["children"]
    assert groups["pdkit_kv_pool"]["hosts"] == {"a": {}}
    records = groups["pdkit_hosts"]["hosts"]["a"]["pdkit_processes"]
    pool = next(r for r in records if r["name"] == "kv-pool")
    assert pool["stage"] == "kv_pool" and pool["url"] == "http://10.0.0.1:9003"
    assert plan.monitoring is not None
    assert "job_name: kv_pool" in prometheus_config(plan.monitoring, plan.name)
    assert "10.0.0.1:9003" in prometheus_config(plan.monitoring, plan.name)


@pytest.mark.parametrize(
    ("pool", "key", "says", "fix"),
    [
        ({"host": "c"}, "kv_pool.host", "no host named 'c'", "use one of: a, b"),
        ({"host_segment_gb": {"z": 1}}, "kv_pool.host_segment_gb.z", "no host", "use one of"),
        ({"segment_gb": 0}, "kv_pool.segment_gb", "no host gives the pool", "segment_gb above 0"),
        ({"metadata_server": "etcd"}, "kv_pool.metadata_server", "neither", "embedded"),
        ({"roles": {"prefill": False}}, "kv_pool.roles", "no role uses", "roles.prefill"),
        ({"mem_layout": "layer_first"}, "kv_pool.mem_layout", "layer_first", "page_first"),
        ({"io_backend": "direct"}, "kv_pool.mem_layout", "page_first", "page_first_direct"),
        ({"mem_layout": "page_first_direct"}, "kv_pool.io_backend", "kernel", "direct"),
        ({"write_policy": "write_back"}, "kv_pool.write_policy", "evicts", "write_through"),
        ({"rpc_port": 8000}, "kv_pool.rpc_port", "port 8000 on a", "port bases"),
        ({"metadata_port": 15500}, "kv_pool.metadata_port", "RPC range", "outside"),
    ],
)
def test_each_pool_mistake_names_the_key_and_the_fix(write_topology, pool, key, says, fix):
    problem = problem_at(write_topology, with_pool(**pool), key)
    assert says in problem.message and fix in problem.fix


def test_rdma_needs_devices_except_on_the_sim(write_topology):
    data = with_pool()
    for host in data["hosts"]:
        host["rdma_devices"], host["gpu_nics"] = [], {}
    data["transfer"]["backend"] = "mooncake_tcp"
    problem = problem_at(write_topology, data, "kv_pool.protocol")
    assert "lists none" in problem.message and "protocol: tcp" in problem.fix
    data["engine"] = "sim"
    plan = resolve(write_topology(data))  # the sim charges the rdma link, moves over TCP
    assert plan.role("prefill")[0].env["MOONCAKE_PROTOCOL"] == "rdma"


def test_args_may_not_set_what_the_pool_sets(write_topology):
    data = with_pool()
    data["prefill"]["args"] = {"hicache-write-policy": "write_back"}
    problem = problem_at(write_topology, data, "prefill.args.hicache-write-policy")
    assert "set by pdkit" in problem.message and "kv_pool.write_policy" in problem.fix


def test_sglang_start_up_rules_see_the_rendered_hicache_flags(write_topology):
    data = with_pool()
    data["defaults"] = {"args": {"disaggregation-decode-allocation-policy": "prefill_complete"}}
    problem = problem_at(write_topology, data, "kv_pool.roles.prefill")
    assert "prefill_complete does not yet support prefill HiCache" in problem.message
