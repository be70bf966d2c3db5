"""Print where this host's GPUs sit as JSON (pdkit_discover's probe): nvidia-smi and sysfs.

Usage: gpu_topology.py [SYS_DIR]   (default /sys)

{"ok": bool, "error": str, "numa_nodes": int,
 "gpus": [{"index", "name", "bus_id", "memory_mib", "numa_node", "pci_path"}]}

`pci_path` is the GPU's place in the PCI tree (root complex, bridges, device), read from
SYS_DIR/bus/pci/devices/<bus id>: a NIC under the same PCIe switch shares a bridge below the
root port. Read-only; never fails: a host without a working driver is reported with ok=false.
"""

import json
import os
import subprocess
import sys

FIELDS = ("index", "name", "pci.bus_id", "memory.total")


def read(path, default=""):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def sysfs_bus_id(bus_id):
    """nvidia-smi's 00000000:1A:00.0 -> sysfs's 0000:1a:00.0."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def pci_path(device_link):
    parts = os.path.realpath(device_link).split(os.sep)
    starts = [i for i, part in enumerate(parts) if part.startswith("pci")]
    return parts[starts[0]:] if starts else []


def main():
    sys_dir = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else "/sys"
    nodes = [n for n in os.listdir(os.path.join(sys_dir, "devices", "system", "node"))
             if n.startswith("node") and n[4:].isdigit()] if os.path.isdir(
                 os.path.join(sys_dir, "devices", "system", "node")) else []
    facts = {"ok": False, "error": "", "numa_nodes": max(len(nodes), 1), "gpus": []}
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["error"] = str(exc)
        print(json.dumps(facts))
        return
    if done.returncode != 0:
        facts["error"] = (done.stderr or done.stdout).strip() or f"nvidia-smi exited {done.returncode}"
        print(json.dumps(facts))
        return
    for line in done.stdout.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(FIELDS):
            continue
        index, name, bus_id, memory = values
        device = os.path.join(sys_dir, "bus", "pci", "devices", sysfs_bus_id(bus_id))
        facts["gpus"].append({
            "index": int(index),
            "name": name,
            "bus_id": sysfs_bus_id(bus_id),
            "memory_mib": int(memory) if memory.isdigit() else 0,
            "numa_node": int(read(os.path.join(device, "numa_node"), "-1") or -1),
            "pci_path": pci_path(device),
        })
    facts["ok"] = True
    print(json.dumps(facts))


main()
