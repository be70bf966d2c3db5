"""`pdkit discover` over SSH on namespace hosts with fake sysfs trees and a fake nvidia-smi
(this machine has neither GPUs nor RDMA cards): hosts a and b are 8-GPU boards with PCIe
switches on two NUMA nodes (b's routable GID sits at another index), host c has nothing. The
proposal maps each GPU to the NIC on its switch, else on its NUMA node, finds the GID index
both hosts share, and --write keeps the topology's comments."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.support.fake_hosts import EXPECTED_NICS, fake_nvidia_smi, fake_sys
from tests.support.multihost import bed_topology, run_pdkit
from tests.support.netns import TestBed


@pytest.fixture
def fake_hosts(testbed: TestBed):
    """Fake sysfs trees under a's and b's roots and nvidia-smi on their PATH; what the test
    adds goes again, so that later tests see the hosts as they were."""
    before = {host.name: set(host.root.iterdir()) for host in testbed.hosts}
    a, b = testbed.host("a"), testbed.host("b")
    fake_sys(a.root / "sys", routable=(3, 5))
    fake_sys(b.root / "sys", routable=(5,))
    for host in (a, b):
        fake_nvidia_smi(host.bin_dir)
    yield
    for host in testbed.hosts:
        (host.bin_dir / "nvidia-smi").unlink(missing_ok=True)
        for path in set(host.root.iterdir()) - before[host.name]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def test_discover_proposes_the_nic_map_and_a_common_gid_index(testbed, fake_hosts, tmp_path):
    topology = bed_topology(testbed, tmp_path, name="disc")
    topology.write_text("# lab: three hosts, NICs unknown\n" + topology.read_text())
    written = tmp_path / "discovered.yaml"
    sys_var = ["-e", "pdkit_discover_sys={{ pdkit_root }}/sys"]
    result = run_pdkit(testbed, "discover", str(topology), *sys_var, "--write", str(written))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "a: 8 GPU(s) NVIDIA H100 80GB HBM3; 2 NUMA node(s)" in out
    assert (
        "  GPU 0: NUMA 0, PCIe switch 0000:01:00.0 -> mlx5_0 (same PCIe switch 0000:01:00.0)" in out
    )
    assert "  GPU 6: NUMA 1, PCIe switch 0000:91:00.0 -> mlx5_3 (same NUMA node 1)" in out
    assert "  mlx5_4: DOWN Ethernet" in out
    assert "c: no GPU read" in out
    assert "transfer.gid_index: 5 (RoCE v2, IPv4-mapped, present on all 8 chosen NIC(s))" in out
    assert "interface of its address: " in out and "Kept in " in out
    assert "hosts[a].gpus: 1 -> 8" in out

    data = yaml.safe_load(written.read_text())
    a, b, c = data["hosts"]
    assert a["gpu_nics"] == EXPECTED_NICS and b["gpu_nics"] == EXPECTED_NICS
    assert (a["gpus"], a["gpu_type"]) == (8, "H100-SXM")
    assert a["rdma_devices"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert c["gpus"] == 0 and "gpu_nics" not in c
    assert data["transfer"] == {"backend": "mooncake_tcp", "gid_index": 5}
    assert written.read_text().startswith("# lab: three hosts, NICs unknown\n")

    as_json = run_pdkit(testbed, "discover", str(topology), *sys_var, "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["gid_index"] == 5
    assert report["hosts"][1]["proposed"]["gpu_nics"] == {
        str(k): v for k, v in EXPECTED_NICS.items()
    }
