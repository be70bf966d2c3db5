"""Print the RDMA devices of this host as JSON (pdkit_rdma's probe), read from sysfs and /proc.

Usage: rdma_facts.py [SYSFS_DIR [GID_INDEX [PROC_DIR]]]
       (default /sys/class/infiniband, no index, /proc)

{"devices": [{"name", "node_type", "fw_ver", "numa_node", "pci_path", "active", "ports": [{"port",
 "state", "phys_state", "link_layer", "rate", "active", "gids": [{"index", "gid", "type",
 "netdev"}]}]}],
 "active_devices": [names with an ACTIVE port],
 "gid_index": GID_INDEX or null, "devices_with_gid_index": [names with a GID at that index],
 "gpudirect": {"nvidia_peermem": bool, "dmabuf": bool, "driver": str, "kernel": str}}

`pci_path` is the device's place in the PCI tree (root complex, bridges, device: the PCIe switch
a NIC shares with a GPU shows as a common bridge). GPUDirect RDMA is there when the
nvidia_peermem module is loaded, or with dma-buf: NVIDIA's open kernel modules on Linux 5.12+.
Only non-zero GIDs are listed. Read-only; a host without RDMA prints {"devices": []}.
"""

import json
import os
import sys

ZERO_GIDS = {"0000:0000:0000:0000:0000:0000:0000:0000", "fe80:0000:0000:0000:0000:0000:0000:0000"}


def read(path, default=""):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def port_facts(port_dir, port):
    gids = []
    for index in sorted(listdir(os.path.join(port_dir, "gids")), key=lambda s: int(s) if s.isdigit() else -1):
        gid = read(os.path.join(port_dir, "gids", index))
        if not gid or gid in ZERO_GIDS:
            continue
        gids.append({
            "index": int(index),
            "gid": gid,
            "type": read(os.path.join(port_dir, "gid_attrs", "types", index)),
            "netdev": read(os.path.join(port_dir, "gid_attrs", "ndevs", index)),
        })
    state = read(os.path.join(port_dir, "state"))  # e.g. "4: ACTIVE"
    return {
        "port": int(port),
        "state": state.split(":", 1)[-1].strip(),
        "phys_state": read(os.path.join(port_dir, "phys_state")).split(":", 1)[-1].strip(),
        "link_layer": read(os.path.join(port_dir, "link_layer")),
        "rate": read(os.path.join(port_dir, "rate")),
        "active": state.endswith("ACTIVE"),
        "gids": gids,
    }


def pci_path(device_link):
    """The PCI path of a sysfs device link: ["pci0000:17", "0000:17:00.0", ...]; [] if none."""
    parts = os.path.realpath(device_link).split(os.sep)
    starts = [i for i, part in enumerate(parts) if part.startswith("pci")]
    return parts[starts[0]:] if starts else []


def gpudirect(proc):
    modules = {line.split()[0] for line in read(os.path.join(proc, "modules")).splitlines() if line}
    driver = read(os.path.join(proc, "driver", "nvidia", "version")).splitlines()
    kernel = read(os.path.join(proc, "sys", "kernel", "osrelease"))
    numbers = [int(n) for n in kernel.split("-")[0].split(".")[:2] if n.isdigit()]
    open_modules = bool(driver) and "Open Kernel Module" in driver[0]
    return {
        "nvidia_peermem": "nvidia_peermem" in modules,
        "dmabuf": open_modules and numbers >= [5, 12],
        "driver": driver[0].strip() if driver else "",
        "kernel": kernel,
    }


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "/sys/class/infiniband"
    gid_index = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "" else None
    proc = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "" else "/proc"
    devices = []
    for name in listdir(root):
        dev = os.path.join(root, name)
        ports = [port_facts(os.path.join(dev, "ports", p), p)
                 for p in listdir(os.path.join(dev, "ports")) if p.isdigit()]
        devices.append({
            "name": name,
            "node_type": read(os.path.join(dev, "node_type")),
            "fw_ver": read(os.path.join(dev, "fw_ver")),
            "numa_node": int(read(os.path.join(dev, "device", "numa_node"), "-1") or -1),
            "pci_path": pci_path(os.path.join(dev, "device")),
            "active": any(p["active"] for p in ports),
            "ports": ports,
        })
    with_gid = [
        d["name"] for d in devices
        if gid_index is not None
        and any(g["index"] == gid_index for p in d["ports"] if p["active"] for g in p["gids"])
    ]
    print(json.dumps({
        "devices": devices,
        "active_devices": [d["name"] for d in devices if d["active"]],
        "gid_index": gid_index,
        "devices_with_gid_index": with_gid,
        "gpudirect": gpudirect(proc),
    }))


main()
