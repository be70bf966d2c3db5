"""Multi-node and DeepEP workers get NCCL's, NVSHMEM's and gloo's devices from the Plan (their
GPUs' NICs, the GID index, the host's interface), unless the topology sets them itself."""

from __future__ import annotations

import copy

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import base_topology


def spanning_decode(interface: str | None = "bond0") -> dict:
    data = base_topology()
    data["hosts"].append({**copy.deepcopy(data["hosts"][1]), "name": "c", "address": "10.0.0.3"})
    for host in data["hosts"]:
        host["network_interface"] = interface
    data["decode"] = {"count": 1, "tp": 16, "hosts": ["b", "c"]}
    data["transfer"]["gid_index"] = 3
    return data


def test_multi_node_workers_get_nccl_nvshmem_and_gloo_settings(write_topology):
    plan = resolve(write_topology(spanning_decode()))
    rank0 = next(w for w in plan.workers if w.role == "decode")
    nics = ",".join(f"mlx5_{i}" for i in range(8))
    assert {k: v for k, v in rank0.env.items() if k.startswith(("NCCL", "NVSHMEM", "GLOO"))} == {
        "NCCL_IB_HCA": "=" + nics,
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "bond0",
        "GLOO_SOCKET_IFNAME": "bond0",
        "NVSHMEM_HCA_LIST": ",".join(f"mlx5_{i}:1" for i in range(8)),
        "NVSHMEM_IB_GID_INDEX": "3",
    }
    assert rank0.env["MC_GID_INDEX"] == "3"


def test_deepep_on_one_host_gets_its_gpus_nics_and_the_users_env_wins(write_topology):
    data = base_topology()
    data["prefill"] = {
        "count": 1,
        "tp": 4,
        "hosts": ["a"],
        "args": {"moe-a2a-backend": "deepep"},
        "env": {"NCCL_IB_HCA": "mlx5_9"},
    }
    plan = resolve(write_topology(data))
    (prefill,) = plan.role("prefill")
    assert prefill.env["NVSHMEM_HCA_LIST"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert prefill.env["NCCL_IB_HCA"] == "mlx5_9"
    assert prefill.env["GLOO_SOCKET_IFNAME"] == "eth0"
    (decode,) = plan.role("decode")  # single node, no DeepEP: nothing added
    assert not [k for k in decode.env if k.startswith(("NCCL", "NVSHMEM", "GLOO"))]


def test_a_multi_node_instance_needs_the_hosts_interface(write_topology):
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(spanning_decode(interface=None)))
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"hosts[1].network_interface", "hosts[2].network_interface"}
    assert "ip -o addr show to 10.0.0.2" in problems["hosts[1].network_interface"].fix
