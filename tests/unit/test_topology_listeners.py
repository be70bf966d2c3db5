"""Every port a worker listens on is in the Plan, those SGLang derives without a flag too, and
no two listeners of one host share one (reference sglang-pd.md section 9)."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import base_topology


def two_dp_attention_prefills_on_one_host() -> dict:
    data = base_topology()
    data["prefill"] = {"count": 2, "tp": 4, "dp": 4, "dp_attention": True, "hosts": ["a"]}
    return data


def used_ports(worker) -> set[int]:
    return {port for use in worker.ports for port in use.ports if use.what != "Mooncake RPC"}


def test_two_dp_attention_instances_on_one_host_take_disjoint_ports(write_topology):
    plan = resolve(write_topology(two_dp_attention_prefills_on_one_host()))
    first, second = plan.role("prefill")
    assert (first.http_port, second.http_port) == (30000, 30001)
    # Each gets its own --dist-init-addr, so SGLang derives its ZMQ block from it, not from
    # --port + 233 (30233.. and 30234.. would overlap: the second one crash-loops).
    assert first.dist_init_addr == "10.0.0.1:5000"
    assert second.dist_init_addr == "10.0.0.1:5050"
    assert "--dist-init-addr" in first.command.args
    assert "--nnodes" not in first.command.args
    assert not used_ports(first) & used_ports(second)


def test_the_plan_lists_the_ports_sglang_derives(write_topology):
    plan = resolve(write_topology(two_dp_attention_prefills_on_one_host()))
    uses = {
        use.what: (use.first, use.last, use.reached_by) for use in plan.role("prefill")[0].ports
    }
    assert uses == {
        "HTTP": (30000, 30000, "clients"),
        "bootstrap": (8998, 8998, "decode hosts"),
        "NCCL": (30500, 30500, "local"),
        "dist-init and DP attention's ZMQ": (5000, 5006, "local"),
        "DP handshake": (5013, 5013, "local"),
        "Mooncake RPC": (15000, 17000, "peer hosts"),
    }
    decode = plan.role("decode")[0]  # tp 4, no DP attention: HTTP, NCCL and Mooncake only
    assert [use.what for use in decode.ports] == ["HTTP", "NCCL", "Mooncake RPC"]


def test_multi_node_followers_list_no_dist_init_block(write_topology):
    data = base_topology()
    data["hosts"].append({**data["hosts"][1], "name": "c", "address": "10.0.0.3"})
    data["decode"] = {"count": 1, "tp": 16, "dp": 16, "dp_attention": True, "hosts": ["b", "c"]}
    plan = resolve(write_topology(data))
    rank0, rank1 = (w for w in plan.workers if w.role == "decode")
    assert {u.what: u.reached_by for u in rank0.ports}["DP handshake"] == "instance nodes"
    assert [u.what for u in rank1.ports] == ["HTTP", "NCCL", "Mooncake RPC"]


def test_a_port_inside_a_derived_block_is_refused(write_topology):
    data = two_dp_attention_prefills_on_one_host()
    data["prefill"]["count"] = 1
    data["decode"] = {"count": 1, "tp": 4, "hosts": ["a"], "port": 5013}
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    messages = [p.message for p in info.value.problems if p.key == "decode.port"]
    assert messages == [
        "port 5013 on a is used by both prefill-0 (DP handshake) and decode-0 (HTTP)."
    ]


def test_dist_init_blocks_of_two_roles_may_not_overlap(write_topology):
    data = two_dp_attention_prefills_on_one_host()
    data["prefill"]["count"] = 1
    data["decode"] = {
        "count": 1,
        "tp": 4,
        "dp": 4,
        "dp_attention": True,
        "hosts": ["a"],
        "dist_init_port": 5004,
    }
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    assert any(
        p.key == "decode.dist_init_port"
        and "prefill-0 (dist-init and DP attention's ZMQ)" in p.message
        for p in info.value.problems
    )
