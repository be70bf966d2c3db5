"""Fake hosts on the file system, for the probe scripts that discovery and provisioning run on
a host: a sysfs tree (NUMA nodes, PCIe switches, RDMA devices with their GID tables), a /proc
(kernel modules, the NVIDIA driver's version) and an nvidia-smi that answers the discovery query.
The unit tests run the scripts on them directly; the multi-host tests put them on the
namespace hosts and run them through Ansible."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def write(path: Path, text: str) -> None:
    """A sysfs-style file: `text` and a newline, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_device(root: Path, name: str, state: str, gids: dict[int, tuple[str, str]]) -> None:
    """RDMA device `name` under `root` (what /sys/class/infiniband would be): port 1 in `state`,
    its GID table {index: (gid, type)}."""
    port = root / name / "ports" / "1"
    write(root / name / "node_type", "1: CA")
    write(root / name / "fw_ver", "28.39.1002")
    write(root / name / "device" / "numa_node", "1")
    write(port / "state", state)
    write(port / "phys_state", "5: LinkUp")
    write(port / "link_layer", "Ethernet")
    write(port / "rate", "400 Gb/sec (4X NDR)")
    write(port / "gids" / "0", "fe80:0000:0000:0000:0000:0000:0000:0000")  # empty slot
    for index, (gid, kind) in gids.items():
        write(port / "gids" / str(index), gid)
        write(port / "gid_attrs" / "types" / str(index), kind)
        write(port / "gid_attrs" / "ndevs" / str(index), "ens1f0")


def fake_proc(root: Path, modules: list[str], driver: str, kernel: str) -> Path:
    """A /proc at `root`: the loaded kernel `modules`, the NVIDIA `driver` version line and the
    `kernel` release."""
    write(root / "modules", "\n".join(f"{m} 16384 0 - Live 0x0" for m in modules))
    write(root / "driver" / "nvidia" / "version", driver)
    write(root / "sys" / "kernel" / "osrelease", kernel)
    return root


PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 2025"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build"

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
