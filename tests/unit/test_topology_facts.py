"""`pdkit discover`'s facts, kept in the state dir, fill what a topology leaves out: the
interface of a host's address, its NIC map, and on RoCE the GID index (the IPv4-mapped RoCE v2
one every worker NIC has); RoCE without a GID index is refused with the fix."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.hosts.discover import address_interface
from kit.plan.resolve import resolve, warnings
from kit.plan.shell import plan_to_shell
from kit.topology.facts import (
    DiscoveredFacts,
    GidFact,
    HostFact,
    NicFact,
    common_gid_index,
    facts_file,
    save_facts,
)
from tests.conftest import base_topology, run_pdkit

NICS = [f"mlx5_{i}" for i in range(8)]


def roce_nic(name: str, ipv4_at: int = 3, link_layer: str = "Ethernet") -> NicFact:
    """A RoCE NIC whose GID table has link-local v1/v2 GIDs at 0 and 1, a global IPv6 RoCE v2
    GID at 2 and the IPv4-mapped RoCE v2 GID at `ipv4_at`."""
    gids = (
        GidFact(index=0, gid="fe80:0000:0000:0000:0000:0000:0000:0001", kind="IB/RoCE v1"),
        GidFact(index=1, gid="fe80:0000:0000:0000:0000:0000:0000:0001", kind="RoCE v2"),
        GidFact(index=2, gid="2001:0db8:0000:0000:0000:0000:0000:0001", kind="RoCE v2"),
        GidFact(index=ipv4_at, gid="0000:0000:0000:0000:0000:ffff:0a00:0001", kind="RoCE v2"),
    )
    return NicFact(name=name, link_layer=link_layer, active=True, gids=gids)


def host_fact(name: str, address: str, ipv4_at: int = 3, **kw) -> HostFact:
    fields = {
        "network_interface": "bond0",
        "rdma_devices": tuple(NICS),
        "gpu_nics": {i: NICS[i] for i in range(8)},
        "nics": tuple(roce_nic(n, ipv4_at) for n in NICS),
    } | kw
    return HostFact(name=name, address=address, **fields)


@pytest.fixture
def roce(write_topology, monkeypatch):
    """A RoCE topology (no GID index) with its discovered facts in its state dir."""
    monkeypatch.delenv("PDKIT_STATE_DIR", raising=False)

    def write(data: dict, facts: DiscoveredFacts | None):
        path = write_topology(data)
        if facts is not None:
            save_facts(facts_file(path, data["name"]), facts)
        return path

    return write


def roce_topology() -> dict:
    data = base_topology()
    data["transfer"] = {"backend": "mooncake"}
    return data


def test_roce_without_a_gid_index_is_refused_with_the_fix(roce):
    data = roce_topology()
    data["transfer"]["fabric"] = "roce"
    with pytest.raises(TopologyError) as caught:
        resolve(roce(data, None))
    (problem,) = caught.value.problems
    assert problem.key == "transfer.gid_index"
    assert "Mooncake falls back to index 3" in problem.message
    assert "show_gids" in problem.fix and "pdkit discover T" in problem.fix


def test_the_discovered_ipv4_mapped_roce_v2_index_is_taken_and_rendered(roce):
    facts = DiscoveredFacts(hosts=(host_fact("a", "10.0.0.1"), host_fact("b", "10.0.0.2")))
    plan = resolve(roce(roce_topology(), facts))
    # 2 is a routable RoCE v2 GID too, but an IPv6 one: the IPv4-mapped index wins.
    assert {w.gid_index for w in plan.workers} == {3}
    assert all(w.env["MC_GID_INDEX"] == "3" for w in plan.workers)
    assert plan.discovered == (
        "transfer.gid_index: 3 (RoCE v2, IPv4-mapped, present on all 16 chosen NIC(s))",
    )
    assert "\n# from `pdkit discover`'s facts: transfer.gid_index: 3 (" in plan_to_shell(plan)


def test_validate_says_which_fields_came_from_discovery(roce):
    facts = DiscoveredFacts(hosts=(host_fact("a", "10.0.0.1"), host_fact("b", "10.0.0.2")))
    data = roce_topology()
    del data["hosts"][1]["network_interface"]
    result = run_pdkit("validate", str(roce(data, facts)))
    assert result.returncode == 0, result.stderr
    assert "from `pdkit discover`'s facts: hosts[b].network_interface: bond0" in result.stdout
    assert "from `pdkit discover`'s facts: transfer.gid_index: 3" in result.stdout


def test_the_explicit_gid_index_wins_over_discovery(roce):
    facts = DiscoveredFacts(hosts=(host_fact("a", "10.0.0.1"), host_fact("b", "10.0.0.2")))
    data = roce_topology()
    data["transfer"]["gid_index"] = 5
    plan = resolve(roce(data, facts))
    assert {w.env["MC_GID_INDEX"] for w in plan.workers} == {"5"}
    assert plan.discovered == ()


def test_no_common_index_in_the_facts_is_refused_with_each_nics_indices(roce):
    facts = DiscoveredFacts(
        hosts=(host_fact("a", "10.0.0.1", ipv4_at=3), host_fact("b", "10.0.0.2", ipv4_at=4))
    )
    data = roce_topology()
    # Only the IPv6 index 2 would be common: drop it from b, so nothing is.
    b = facts.hosts[1]
    nics = tuple(n.model_copy(update={"gids": n.gids[:2] + n.gids[3:]}) for n in b.nics)
    facts = DiscoveredFacts(hosts=(facts.hosts[0], b.model_copy(update={"nics": nics})))
    with pytest.raises(TopologyError) as caught:
        resolve(roce(data, facts))
    (problem,) = caught.value.problems
    assert problem.key == "transfer.gid_index"
    assert "a/mlx5_0: [2, 3]" in problem.message and "b/mlx5_0: [4]" in problem.message


def test_infiniband_facts_need_no_gid_index(roce):
    ib = tuple(roce_nic(n, link_layer="InfiniBand") for n in NICS)
    facts = DiscoveredFacts(
        hosts=(host_fact("a", "10.0.0.1", nics=ib), host_fact("b", "10.0.0.2", nics=ib))
    )
    path = roce(roce_topology(), facts)
    plan = resolve(path, strict=True)
    assert {w.gid_index for w in plan.workers} == {None}
    assert warnings(path) == []


def test_rdma_of_unknown_link_layer_warns_and_strict_refuses(roce):
    path = roce(roce_topology(), None)
    (warning,) = warnings(path)
    assert warning.key == "transfer.backend" and "InfiniBand or RoCE" in warning.message
    assert "pdkit discover T" in warning.fix
    with pytest.raises(TopologyError):
        resolve(path, strict=True)


def test_a_multi_node_instance_takes_the_interface_and_nic_map_from_discovery(roce):
    data = roce_topology()
    data["transfer"]["gid_index"] = 3
    c = {"name": "c", "address": "10.0.0.3", "gpus": 8}
    b = {"name": "b", "address": "10.0.0.2", "gpus": 8, "network_interface": "eth9"}
    data["hosts"] = [data["hosts"][0], b, c]
    data["prefill"] = {"count": 1, "tp": 8, "hosts": ["a"]}
    data["decode"] = {"count": 1, "tp": 16, "hosts": ["b", "c"]}
    with pytest.raises(TopologyError, match="network_interface"):
        resolve(roce(data, None))
    facts = DiscoveredFacts(
        hosts=(
            host_fact("b", "10.0.0.2"),
            host_fact("c", "10.0.0.3"),
            host_fact("a", "10.9.9.9", network_interface="stale0"),  # found at another address
        )
    )
    plan = resolve(roce(data, facts))
    node0, node1 = (w for w in plan.workers if w.role == "decode")
    assert node0.env["GLOO_SOCKET_IFNAME"] == "eth9"  # the topology's key wins
    assert node1.env["GLOO_SOCKET_IFNAME"] == node1.env["NCCL_SOCKET_IFNAME"] == "bond0"
    assert node1.gpu_nics == {i: NICS[i] for i in range(8)}
    assert "hosts[c].network_interface: bond0" in plan.discovered
    assert "hosts[c].gpu_nics: {0: mlx5_0, 1: mlx5_1, 2: mlx5_2, 3: mlx5_3, 4: mlx5_4, " in (
        "\n".join(plan.discovered)
    )
    assert not any(line.startswith("hosts[a]") for line in plan.discovered)


def test_a_discovered_nic_map_is_taken_only_when_it_covers_every_gpu(roce):
    data = roce_topology()
    data["transfer"]["gid_index"] = 3
    data["hosts"][1] |= {"gpus": 4, "rdma_devices": NICS[:4], "gpu_nics": {}}
    data["decode"]["tp"] = 4
    facts = DiscoveredFacts(hosts=(host_fact("b", "10.0.0.2"),))
    (decode,) = resolve(roce(data, facts)).role("decode")
    assert decode.gpu_nics == {i: NICS[i] for i in range(4)}  # GPUs 4-7 are not b's
    data["hosts"][1]["rdma_devices"] = NICS[:2]  # GPUs 2, 3 would have no NIC: host mode
    (decode,) = resolve(roce(data, facts)).role("decode")
    assert (decode.gpu_nics, decode.rdma_devices) == ({}, ("mlx5_0", "mlx5_1"))


def test_the_common_index_prefers_ipv4_mapped_over_lower_routable_ones():
    nics = [("a", roce_nic("mlx5_0", 7)), ("b", roce_nic("mlx5_0", 7))]
    assert common_gid_index(nics)[0] == 7
    ipv6_only = [("a", roce_nic("x", 7)), ("b", roce_nic("x", 8))]
    assert common_gid_index(ipv6_only) == (
        2,
        "RoCE v2, routable, present on all 2 chosen NIC(s)",
    )
    ib = [("a", roce_nic("x", link_layer="InfiniBand"))]
    assert common_gid_index(ib) == (None, "no RoCE NIC chosen: no GID index needed")


def test_the_interface_of_the_address_is_read_from_ip_addr():
    line = "2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever"
    assert address_interface(line) == "eth0"
    assert address_interface("5: eth0.100@eth0    inet 10.1.0.1/24 scope global") == "eth0.100"
    assert address_interface("") is None


def test_the_facts_are_read_from_the_state_dir_the_command_is_given(roce, tmp_path):
    facts = DiscoveredFacts(hosts=(host_fact("a", "10.0.0.1"), host_fact("b", "10.0.0.2")))
    path = roce(roce_topology(), None)
    save_facts(facts_file(path, "t", tmp_path / "state"), facts)
    with pytest.raises(TopologyError):
        resolve(path, strict=True)  # unknown link layer: refused under --strict
    result = run_pdkit("validate", str(path), "--strict", "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 0, result.stderr
    assert "transfer.gid_index: 3" in result.stdout


def test_a_damaged_facts_file_is_refused_with_the_fix(roce):
    path = roce(roce_topology(), None)
    damaged = facts_file(path, "t")
    damaged.parent.mkdir(parents=True)
    damaged.write_text("{not json")
    result = run_pdkit("validate", str(path))
    assert result.returncode == 1
    assert "is not `pdkit discover`'s facts" in result.stderr
    assert "run `pdkit discover` again, or delete the file" in result.stderr
