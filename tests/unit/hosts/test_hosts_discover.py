"""Discovery on fake hosts: the probe script reads a fake sysfs tree (PCIe switches, NUMA nodes,
NICs up and down, GID tables) and a fake nvidia-smi; the proposal maps each GPU to the NIC on
its PCIe switch, else on its NUMA node, and finds the routable RoCE v2 GID index every chosen
NIC has. The multi-host test runs the same trees through `pdkit discover` over SSH."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from kit.hosts.discover import HostFacts, gpu_type, propose
from tests.conftest import REPO
from tests.unit.hosts.test_hosts_provision_probes import write

ROLES = REPO / "playbooks" / "roles"

# (bdf, PCI path above it, NUMA node): two root complexes, one per NUMA node, PCIe switches
# below their root ports, as on an 8-GPU HGX board.
SW0 = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
SW1 = ("pci0000:00", "0000:00:02.0", "0000:11:00.0")
SW2 = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
SW3 = ("pci0000:80", "0000:80:02.0", "0000:91:00.0")
SW4 = ("pci0000:80", "0000:80:03.0", "0000:a1:00.0")
GPUS = [  # index, bdf, switch, NUMA
    (0, "0000:03:00.0", SW0, 0),
    (1, "0000:04:00.0", SW0, 0),
    (2, "0000:13:00.0", SW1, 0),
    (3, "0000:14:00.0", SW1, 0),
    (4, "0000:83:00.0", SW2, 1),
    (5, "0000:84:00.0", SW2, 1),
    (6, "0000:93:00.0", SW3, 1),  # no NIC under this switch that is up
    (7, "0000:94:00.0", SW3, 1),
]
NICS = [  # name, bdf, switch, NUMA, port state
    ("mlx5_0", "0000:05:00.0", SW0, 0, "4: ACTIVE"),
    ("mlx5_1", "0000:15:00.0", SW1, 0, "4: ACTIVE"),
    ("mlx5_2", "0000:85:00.0", SW2, 1, "4: ACTIVE"),
    ("mlx5_3", "0000:a5:00.0", SW4, 1, "4: ACTIVE"),
    ("mlx5_4", "0000:95:00.0", SW3, 1, "1: DOWN"),
]
EXPECTED_NICS = {0: "mlx5_0", 1: "mlx5_0", 2: "mlx5_1", 3: "mlx5_1"}
EXPECTED_NICS |= {4: "mlx5_2", 5: "mlx5_2", 6: "mlx5_3", 7: "mlx5_3"}


def fake_nvidia_smi(folder: Path) -> Path:
    """nvidia-smi answering the discovery query for the eight GPUs above."""
    rows = "\n".join(
        f"{i}, NVIDIA H100 80GB HBM3, 0000{bdf.upper()}, 81559" for i, bdf, _, _ in GPUS
    )
    tool = folder / "nvidia-smi"
    write(tool, f'#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat <<EOF\n{rows}\nEOF\n;;\nesac')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return tool


def fake_sys(root: Path, routable: tuple[int, ...] = (3, 5)) -> Path:
    """A sysfs tree at `root` (what /sys would be): NUMA nodes, the PCI devices above, the
    RDMA devices with their `device` links; each NIC's routable RoCE v2 GIDs at `routable`."""
    for node in (0, 1):
        (root / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True, exist_ok=True)

    def pci(bdf: str, switch: tuple[str, ...], numa: int) -> Path:
        downstream = f"{bdf[:5]}{int(bdf[5:7], 16) - 1:02x}:00.0"  # the switch's port
        device = root / "devices" / Path(*switch) / downstream / bdf
        write(device / "numa_node", str(numa))
        link = root / "bus" / "pci" / "devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(device, link.parent))
        return device

    for _, bdf, switch, numa in GPUS:
        pci(bdf, switch, numa)
    for n, (name, bdf, switch, numa, state) in enumerate(NICS):
        device = pci(bdf, switch, numa)
        ib = root / "class" / "infiniband" / name
        port = ib / "ports" / "1"
        write(ib / "node_type", "1: CA")
        write(port / "state", state)
        write(port / "phys_state", "5: LinkUp")
        write(port / "link_layer", "Ethernet")
        write(port / "rate", "400 Gb/sec (4X NDR)")
        gids = {
            0: (f"fe80:0000:0000:0000:0000:0000:0000:{n + 1:04x}", "IB/RoCE v1"),
            1: (f"fe80:0000:0000:0000:0000:0000:0000:{n + 1:04x}", "RoCE v2"),
            2: (f"0000:0000:0000:0000:0000:ffff:0a00:{n + 1:04x}", "IB/RoCE v1"),
        }
        gids |= {
            i: (f"0000:0000:0000:0000:0000:ffff:0a00:{n + 1:04x}", "RoCE v2") for i in routable
        }
        for index, (gid, kind) in gids.items():
            write(port / "gids" / str(index), gid)
            write(port / "gid_attrs" / "types" / str(index), kind)
            write(port / "gid_attrs" / "ndevs" / str(index), f"ens{n}")
        (ib / "device").symlink_to(os.path.relpath(device, ib))
    return root


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
