"""The settings a multi-node or wide-EP cluster needs (#36 item 5): --nccl-port planned for every
instance, the ZMQ allow-list of multi-node instances, the RoCE GID index, the wide-EP profile and
the facts `pdkit discover` saved."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import base_topology


def flag(args: tuple[str, ...], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_every_instance_gets_an_nccl_port_apart_from_the_others(write_topology):
    plan = resolve(write_topology(base_topology()))
    ports = [(w.host, w.nccl_port) for w in plan.workers]
    assert ports == [("a", 30500), ("a", 30501), ("b", 30600)]
    for w in plan.workers:
        assert flag(w.command.args, "--nccl-port") == str(w.nccl_port)
        assert any(u.what == "NCCL" and u.first == w.nccl_port for u in w.ports)


def test_a_multi_node_instance_has_one_nccl_port_on_every_node(write_topology):
    data = base_topology()
    data["prefill"] = {"count": 1, "tp": 16}
    data["decode"] = {"count": 1, "tp": 8, "hosts": ["c"]}
    data["hosts"].append({**data["hosts"][1], "name": "c", "address": "10.0.0.3"})
    plan = resolve(write_topology(data))
    prefill = [w for w in plan.workers if w.role == "prefill"]
    assert [w.nccl_port for w in prefill] == [30500, 30500]


def test_dp_replicas_pick_their_own_nccl_ports(write_topology):
    """SGLang gives every replica the one --nccl-port and binds it once per replica."""
    data = base_topology()
    data["decode"] = {"count": 1, "tp": 2, "dp": 2, "hosts": ["b"]}
    plan = resolve(write_topology(data))
    (decode,) = [w for w in plan.workers if w.role == "decode"]
    assert decode.nccl_port is None and "--nccl-port" not in decode.command.args


def test_an_nccl_port_on_the_routers_metrics_port_is_refused(write_topology):
    data = base_topology()
    data["router"] = {"host": "a", "kind": "smg"}
    data["prefill"]["nccl_port"] = 28999
    with pytest.raises(TopologyError) as caught:
        resolve(write_topology(data))
    assert "port 29000 on a is used by both prefill-1 (NCCL) and the router's metrics" in str(
        caught.value
    )


def multi_node_prefill(version: str = "0.5.23") -> dict:
    data = base_topology()
    data["sglang_version"] = version
    data["hosts"].append({**data["hosts"][1], "name": "c", "address": "10.0.0.3"})
    data["prefill"] = {"count": 1, "tp": 16, "hosts": ["b", "c"]}
    data["decode"] = {"count": 1, "tp": 8, "hosts": ["a"]}
    return data


def test_a_multi_node_instance_admits_only_its_nodes_to_its_zmq_sockets(write_topology):
    plan = resolve(write_topology(multi_node_prefill()))
    node0, node1 = (w for w in plan.workers if w.role == "prefill")
    assert node0.env["SGLANG_ZMQ_ALLOWED_PEERS"] == "10.0.0.2,10.0.0.3"
    assert node1.env["SGLANG_ZMQ_ALLOWED_PEERS"] == "10.0.0.2,10.0.0.3"
    assert (node0.env["SGLANG_ZMQ_SOURCE_IP"], node1.env["SGLANG_ZMQ_SOURCE_IP"]) == (
        "10.0.0.2",
        "10.0.0.3",
    )
    (decode,) = [w for w in plan.workers if w.role == "decode"]
    assert "SGLANG_ZMQ_ALLOWED_PEERS" not in decode.env  # one node: no TCP peers


def test_no_zmq_allow_list_where_sglang_has_none_or_a_node_has_a_name(write_topology):
    old = resolve(write_topology(multi_node_prefill("0.5.22"), "old.yaml"))
    assert not any("SGLANG_ZMQ_ALLOWED_PEERS" in w.env for w in old.workers)
    named = multi_node_prefill()
    named["hosts"][2]["address"] = "node-c.cluster"
    plan = resolve(write_topology(named, "named.yaml"))
    assert not any("SGLANG_ZMQ_ALLOWED_PEERS" in w.env for w in plan.workers)


def test_the_wide_ep_profile_raises_every_timeout_and_keeps_deep_gemm_kernels(write_topology):
    data = multi_node_prefill()
    data["cluster"] = {"profile": "wide_ep"}
    plan = resolve(write_topology(data))
    for w in plan.workers:
        assert flag(w.command.args, "--watchdog-timeout") == "3600"
        assert flag(w.command.args, "--dist-timeout") == "3600"
        assert w.env["TORCH_DISTRIBUTED_DEFAULT_TIMEOUT"] == "3600"
        assert w.env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "60"
        assert w.env["SGLANG_DG_CACHE_DIR"] == "/var/cache/pdkit/deep_gemm"
    assert plan.readiness_timeout_s == 3600


def test_explicit_keys_win_over_the_profile(write_topology):
    data = multi_node_prefill()
    data["cluster"] = {
        "profile": "wide_ep",
        "watchdog_timeout_s": 900,
        "deep_gemm_cache_dir": "/data/dg",
        "readiness_timeout_s": 7200,
    }
    data["transfer"]["timeouts"] = {"heartbeat_max_failures": 5}
    data["decode"]["args"] = {"watchdog-timeout": 1200}
    plan = resolve(write_topology(data))
    prefill, _, decode = plan.workers
    assert flag(prefill.command.args, "--watchdog-timeout") == "900"
    assert flag(decode.command.args, "--watchdog-timeout") == "1200"  # a role's args win
    assert prefill.env["SGLANG_DG_CACHE_DIR"] == "/data/dg"
    assert prefill.env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "5"
    assert plan.readiness_timeout_s == 7200


def test_the_standard_profile_renders_nothing_of_its_own(write_topology):
    plan = resolve(write_topology(base_topology()))
    assert plan.readiness_timeout_s is None
    for w in plan.workers:
        assert "--watchdog-timeout" not in w.command.args
        assert "SGLANG_DG_CACHE_DIR" not in w.env
        assert w.env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"
