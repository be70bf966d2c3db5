"""Discovery on fake hosts: the probe script reads a fake sysfs tree (PCIe switches, NUMA nodes,
NICs up and down, GID tables) and a fake nvidia-smi; the proposal maps each GPU to the NIC on
its PCIe switch, else on its NUMA node, and finds the routable RoCE v2 GID index every chosen
NIC has. The multi-host test runs the same trees through `pdkit discover` over SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kit.hosts.discover import HostFacts, gpu_type, kept_facts, propose
from kit.topology.schema import Topology
from tests.conftest import REPO, base_topology
from tests.support.fake_hosts import EXPECTED_NICS, SW0, fake_nvidia_smi, fake_sys

ROLES = REPO / "playbooks" / "roles"


def probe(tmp_path: Path, routable: tuple[int, ...] = (3, 5), host: str = "a") -> HostFacts:
    """Run both probe scripts as discover.yml does, on a fake host."""
    sys_root = fake_sys(tmp_path / host / "sys", routable)
    fake_nvidia_smi(tmp_path / host / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / host / 'bin'}:{os.environ['PATH']}"}

    def run(script: Path, *args: str) -> dict:
        done = subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return json.loads(done.stdout)

    gpus = run(ROLES / "pdkit_discover" / "files" / "gpu_topology.py", str(sys_root))
    rdma = run(ROLES / "pdkit_rdma" / "files" / "rdma_facts.py", str(sys_root / "class/infiniband"))
    return HostFacts.parse(host, {"gpus": gpus, "rdma": rdma})


def test_the_probe_reads_gpus_numa_nodes_and_pcie_switches(tmp_path):
    facts = probe(tmp_path)
    assert facts.numa_nodes == 2
    assert [(g.index, g.numa, g.switch) for g in facts.gpus[:3]] == [
        (0, 0, "0000:01:00.0"),
        (1, 0, "0000:01:00.0"),
        (2, 0, "0000:11:00.0"),
    ]
    nic = facts.nics[0]
    assert (nic.name, nic.numa, nic.link_layer, nic.rate) == (
        "mlx5_0",
        0,
        "Ethernet",
        "400 Gb/sec (4X NDR)",
    )
    assert nic.pci_path[:3] == SW0
    assert nic.routable_v2_indices == {3, 5}  # not the link-local v2 GID at 1
    assert [n.active for n in facts.nics] == [True, True, True, True, False]


def test_each_gpu_gets_the_nic_on_its_switch_else_on_its_numa_node(tmp_path):
    (host,) = propose([probe(tmp_path)]).hosts
    assert host.gpu_nics == EXPECTED_NICS
    assert host.rdma_devices == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")  # mlx5_4 is down
    assert (host.gpus, host.gpu_type) == (8, "H100-SXM")
    why = {p.gpu: p.why for p in host.picks}
    assert why[0] == "same PCIe switch 0000:01:00.0"
    assert why[6] == "same NUMA node 1"


def test_the_gid_index_is_routable_roce_v2_and_common_to_every_host(tmp_path):
    proposal = propose([probe(tmp_path, (3, 5), "a"), probe(tmp_path, (5,), "b")])
    assert proposal.gid_index == 5  # a has 3 and 5, b only 5
    assert "present on all 8 chosen NIC(s)" in proposal.gid_note
    apart = propose([probe(tmp_path, (3,), "c"), probe(tmp_path, (4,), "d")])
    assert apart.gid_index is None
    assert "c/mlx5_0: [3]" in apart.gid_note and "d/mlx5_0: [4]" in apart.gid_note


def test_gpu_names_map_to_the_performance_models_names():
    assert gpu_type("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert gpu_type("NVIDIA A100-SXM4-40GB") == "A100-40G"
    assert gpu_type("NVIDIA H200") == "H200"
    assert gpu_type("NVIDIA RTX 6000 Ada Generation") == "RTX 6000 Ada Generation"


def test_the_facts_kept_for_later_commands_hold_the_interface_map_and_gid_tables(tmp_path):
    facts = probe(tmp_path)
    data = {"gpus": {}, "rdma": {}, "address": "2: bond0    inet 10.0.0.1/24 scope global bond0"}
    assert HostFacts.parse("a", data).network_interface == "bond0"
    facts = HostFacts(**{**facts.__dict__, "network_interface": "bond0"})
    proposal = propose([facts])
    assert proposal.hosts[0].fields()["network_interface"] == "bond0"
    topology = Topology.model_validate(base_topology())
    (kept,) = kept_facts(topology, [facts], proposal).hosts
    assert (kept.name, kept.address, kept.network_interface) == ("a", "10.0.0.1", "bond0")
    assert kept.gpu_nics == EXPECTED_NICS
    assert kept.nic("mlx5_0").ipv4_v2_indices == {3, 5}
