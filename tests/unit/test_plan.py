"""The Plan is the whole contract: every later stage reads these fields, resolved once."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.observe.targets import targets_from_plan
from kit.plan.resolve import resolve
from tests.conftest import REPO, base_topology


def test_relative_roots_and_key_files_are_absolute_in_the_plan(write_topology, tmp_path):
    data = base_topology()
    data["hosts"][0]["root"] = "hosts/a"
    data["router"]["api_key_file"] = "keys/router"
    plan = resolve(write_topology(data))
    assert plan.host("a").root == str(tmp_path / "hosts" / "a")
    assert plan.host("b").root == "/"
    assert plan.router.api_key_file == str(tmp_path / "keys" / "router")
    prefill = plan.workers[0]
    assert prefill.log_path == f"{tmp_path}/hosts/a/var/log/pdkit/t/prefill-0.log"
    assert plan.router.log_path == f"{tmp_path}/hosts/a/var/log/pdkit/t/router.log"


def test_each_process_carries_its_names_parallelism_and_nics(write_topology):
    data = base_topology()
    data["transfer"]["gid_index"] = 3
    plan = resolve(write_topology(data))
    p1 = plan.workers[1]
    assert (p1.name, p1.instance_name, p1.unit) == (
        "prefill-1",
        "prefill-1",
        "pdkit-t-prefill-1.service",
    )
    assert (p1.parallelism.tp, p1.parallelism.attn_tp, p1.parallelism.gpus) == (2, 2, 2)
    assert p1.gpus == (2, 3)
    assert p1.rdma_devices == ("mlx5_2", "mlx5_3")
    assert p1.gpu_nics == {2: "mlx5_2", 3: "mlx5_3"}
    assert p1.gid_index == 3
    decode = plan.role("decode")[0]
    assert decode.parallelism.tp == 4 and decode.rdma_devices == tuple(
        f"mlx5_{i}" for i in range(4)
    )


def test_a_multi_node_instance_names_each_node_and_shares_its_instance(write_topology):
    data = base_topology()
    data["prefill"] = {"count": 1, "tp": 16}
    data["decode"] = {"count": 1, "tp": 8, "hosts": ["c"]}
    data["hosts"].append(dict(data["hosts"][1], name="c", address="10.0.0.3"))
    plan = resolve(write_topology(data))
    nodes = [w for w in plan.workers if w.role == "prefill"]
    assert [w.name for w in nodes] == ["prefill-0-node0", "prefill-0-node1"]
    assert {w.instance_name for w in nodes} == {"prefill-0"}
    assert [w.unit for w in nodes] == [
        "pdkit-t-prefill-0-node0.service",
        "pdkit-t-prefill-0-node1.service",
    ]
    assert nodes[0].parallelism.gpus == 16 and nodes[0].gpus == tuple(range(8))


@pytest.mark.parametrize(
    ("mode", "devices", "per_gpu"),
    [
        (None, ("mlx5_0", "mlx5_1"), {0: "mlx5_0", 1: "mlx5_1"}),
        ("host", tuple(f"mlx5_{i}" for i in range(8)), {}),
        (["mlx5_7", "mlx5_6"], ("mlx5_7", "mlx5_6"), {}),
    ],
)
def test_rdma_devices_follow_transfer_ib_devices(write_topology, mode, devices, per_gpu):
    data = base_topology()
    data["prefill"]["tp"] = 2
    if mode is not None:
        data["transfer"]["ib_devices"] = mode
    prefill = resolve(write_topology(data)).workers[0]
    assert prefill.rdma_devices == devices
    assert prefill.gpu_nics == per_gpu


def test_listed_ib_devices_must_exist_on_every_worker_host(write_topology):
    data = base_topology()
    data["transfer"]["ib_devices"] = ["mlx5_0", "mlx5_9"]
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    messages = [str(p) for p in info.value.problems]
    assert len(messages) == 2  # one per worker host
    assert all("transfer.ib_devices: mlx5_9 is not in" in m for m in messages)
    assert "hosts[0].rdma_devices" in messages[0]
    assert info.value.problems[0].line is not None


@pytest.mark.parametrize("address", ["::1", "[::1]"])
def test_an_ipv6_host_renders_bracketed_urls_everywhere(write_topology, address):
    data = {
        "name": "v6",
        "engine": "sim",
        "model": {"path": "m"},
        "hosts": [
            {"name": "h", "address": address, "connection": "local", "gpus": 2},
        ],
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"bind": "::1"},
    }
    plan = resolve(write_topology(data))
    prefill, decode = plan.workers
    assert prefill.url == "http://[::1]:30000" and decode.url == "http://[::1]:30100"
    assert prefill.address == "::1" and plan.host("h").address == "::1"
    args = list(prefill.command.args)
    assert args[args.index("--host") + 1] == "::1"
    assert prefill.env["SGLANG_HOST_IP"] == "::1"
    router_args = list(plan.router.command.args)
    assert router_args[router_args.index("--prefill") + 1] == "http://[::1]:30000"
    assert router_args[router_args.index("--decode") + 1] == "http://[::1]:30100"
    assert plan.router.url == "http://[::1]:8000"
    assert plan.router.metrics_url == "http://[::1]:8000/metrics"
    targets = targets_from_plan(plan)
    assert [t.url for t in targets.workers] == ["http://[::1]:30000", "http://[::1]:30100"]


def test_a_multi_node_ipv6_instance_brackets_its_dist_init_address(write_topology):
    data = base_topology()
    data["hosts"][0]["address"] = "[fd00::1]"
    data["hosts"][1]["address"] = "fd00::2"
    data["prefill"] = {"count": 1, "tp": 16}
    data["decode"] = {"count": 1, "tp": 1, "hosts": ["a"]}
    data["hosts"].append(dict(data["hosts"][1], name="c", address="fd00::3"))
    data["prefill"]["hosts"] = ["b", "c"]
    plan = resolve(write_topology(data))
    assert plan.workers[0].dist_init_addr == "[fd00::2]:5000"


def test_library_callers_get_the_router_option_check(write_topology):
    data = base_topology()
    data["router"]["args"] = {"health-interval": "soon"}
    refused = (
        r"router\.args\.health-interval: pdkit's router would refuse it: 'soon' is not a number"
    )
    with pytest.raises(TopologyError, match=refused):
        resolve(write_topology(data))


def test_every_example_topology_resolves_to_absolute_roots():
    for path in sorted((REPO / "topologies").glob("*.yaml")):
        plan = resolve(path)
        assert all(h.root.startswith("/") for h in plan.hosts), path
