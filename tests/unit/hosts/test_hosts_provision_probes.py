"""The read-only probe scripts of the nvidia and rdma roles, run as Ansible runs them on a host:
on a fake sysfs tree and a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.fake_hosts import OPEN, PROPRIETARY, fake_device, fake_proc, write

ROLES = REPO / "playbooks" / "roles"


def rdma_facts(*args: str) -> dict:
    script = ROLES / "pdkit_rdma" / "files" / "rdma_facts.py"
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_rdma_facts_list_devices_ports_and_real_gids(tmp_path):
    fake_device(
        tmp_path, "mlx5_0", "4: ACTIVE", {3: ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")}
    )
    fake_device(tmp_path, "mlx5_1", "1: DOWN", {})
    facts = rdma_facts(str(tmp_path), "3")
    assert facts["active_devices"] == ["mlx5_0"]
    assert facts["devices_with_gid_index"] == ["mlx5_0"]
    first = facts["devices"][0]
    assert (first["name"], first["numa_node"], first["active"]) == ("mlx5_0", 1, True)
    port = first["ports"][0]
    assert (port["state"], port["link_layer"], port["rate"]) == (
        "ACTIVE",
        "Ethernet",
        "400 Gb/sec (4X NDR)",
    )
    assert port["gids"] == [
        {
            "index": 3,
            "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
            "type": "RoCE v2",
            "netdev": "ens1f0",
        }
    ]
    assert rdma_facts(str(tmp_path), "5")["devices_with_gid_index"] == []


def test_a_host_without_rdma_has_no_devices(tmp_path):
    facts = rdma_facts(str(tmp_path / "none"), "", str(tmp_path / "proc"))
    assert facts == {
        "devices": [],
        "active_devices": [],
        "gid_index": None,
        "devices_with_gid_index": [],
        "gpudirect": {"nvidia_peermem": False, "dmabuf": False, "driver": "", "kernel": ""},
    }


def test_gpudirect_is_nvidia_peermem_or_dmabuf_with_open_modules(tmp_path):
    def gpudirect(modules: list[str], driver: str, kernel: str) -> dict:
        proc = fake_proc(
            tmp_path / f"proc-{len(list(tmp_path.iterdir()))}", modules, driver, kernel
        )
        return rdma_facts(str(tmp_path / "none"), "", str(proc))["gpudirect"]

    peermem = gpudirect(["nvidia_peermem", "nvidia"], PROPRIETARY, "5.15.0-91-generic")
    assert (peermem["nvidia_peermem"], peermem["dmabuf"]) == (True, False)
    dmabuf = gpudirect(["nvidia"], OPEN, "6.8.0-45-generic")
    assert (dmabuf["nvidia_peermem"], dmabuf["dmabuf"]) == (False, True)
    old_kernel = gpudirect(["nvidia"], OPEN, "5.4.0-150-generic")
    assert (old_kernel["nvidia_peermem"], old_kernel["dmabuf"]) == (False, False)
    assert gpudirect(["nvidia"], PROPRIETARY, "6.8.0")["dmabuf"] is False


def test_a_nic_behind_a_pci_bridge_has_its_pci_path(tmp_path):
    sys_root = tmp_path / "sys"
    nic = sys_root / "devices" / "pci0000:17" / "0000:17:00.0" / "0000:18:00.0" / "0000:1b:00.0"
    write(nic / "numa_node", "0")
    fake_device(sys_root / "class" / "infiniband", "mlx5_0", "4: ACTIVE", {})
    link = sys_root / "class" / "infiniband" / "mlx5_0" / "device"
    for child in link.iterdir():
        child.unlink()
    link.rmdir()
    link.symlink_to(nic)
    (device,) = rdma_facts(str(sys_root / "class" / "infiniband"))["devices"]
    assert device["pci_path"] == ["pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:1b:00.0"]
    assert device["numa_node"] == 0


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*)
    echo '0, NVIDIA H100 80GB HBM3, 570.86.15, Enabled'
    echo '1, NVIDIA H100 80GB HBM3, 570.86.15, Disabled' ;;
  *) echo '| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8 |' ;;
esac
"""


def nvidia_facts(path_dirs: list[Path]) -> dict:
    script = ROLES / "pdkit_nvidia" / "files" / "nvidia_facts.py"
    env = {**os.environ, "PATH": os.pathsep.join(str(p) for p in path_dirs)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(done.stdout)


def test_nvidia_facts_read_gpus_driver_and_cuda(tmp_path):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    facts = nvidia_facts([tmp_path])
    assert facts["ok"] is True
    assert [g["persistence_mode"] for g in facts["gpus"]] == ["Enabled", "Disabled"]
    assert facts["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "570.86.15",
        "persistence_mode": "Enabled",
    }
    assert (facts["driver_branch"], facts["cuda_version"], facts["nvswitches"]) == (
        "570",
        "12.8",
        0,
    )


def test_no_driver_is_reported_not_raised(tmp_path):
    facts = nvidia_facts([tmp_path])
    assert facts["ok"] is False
    assert facts["error"]
    assert facts["gpus"] == []


def test_nvidia_facts_read_the_drivers_ibgda_options(tmp_path):
    proc = tmp_path / "proc"
    write(
        proc / "driver" / "nvidia" / "params",
        'EnableStreamMemOPs: 1\nRegistryDwords: "PeerMappingOverride=1;"\n',
    )
    script = ROLES / "pdkit_nvidia" / "files" / "nvidia_facts.py"
    env = {**os.environ, "PATH": str(tmp_path)}

    def facts(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return json.loads(done.stdout)["ibgda"]

    assert facts(str(proc)) == {"stream_mem_ops": True, "peer_mapping_override": True}
    write(proc / "driver" / "nvidia" / "params", 'EnableStreamMemOPs: 0\nRegistryDwords: ""\n')
    off = {"stream_mem_ops": False, "peer_mapping_override": False}
    assert facts(str(proc)) == off
    assert facts(str(tmp_path / "none")) == off


def mooncake_build(tmp_path: Path, cuda: str | None) -> subprocess.CompletedProcess[str]:
    """The python role's probe, run by an interpreter whose torch reports CUDA `cuda` (a fake
    torch first on the path)."""
    site = tmp_path / "site"
    write(site / "torch" / "__init__.py", "")
    write(site / "torch" / "version.py", f"cuda = {cuda!r}")
    script = ROLES / "pdkit_python" / "files" / "mooncake_build.py"
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, env=env
    )


def test_the_mooncake_build_follows_torchs_cuda_not_the_drivers(tmp_path):
    cases = {"13.0": "mooncake-transfer-engine-cuda13", "12.8": "mooncake-transfer-engine"}
    for cuda, package in cases.items():
        done = mooncake_build(tmp_path / cuda, cuda)
        assert done.stdout.strip() == package, done.stderr
    cpu = mooncake_build(tmp_path / "cpu", None)
    assert cpu.stdout.strip() == "mooncake-transfer-engine-non-cuda"
    old = mooncake_build(tmp_path / "11", "11.8")
    assert old.returncode != 0
    assert "torch is built for CUDA 11.8" in old.stderr


def test_the_wheelhouse_tool_defaults_to_the_cuda_13_mooncake_build():
    # Resolving only: the requirements the tool passes to pip, printed by its --help default.
    result = subprocess.run(
        [sys.executable, "-m", "tools.wheelhouse", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "default 13: SGLang 0.5.23's torch 2.14.1" in " ".join(result.stdout.split())


def find_python(bin_dir: Path, *candidates: str) -> str:
    """The python role's interpreter search, with only `bin_dir` on PATH."""
    script = ROLES / "pdkit_python" / "files" / "find_python.sh"
    env = {"PATH": str(bin_dir)}
    done = subprocess.run(
        ["/bin/sh", str(script), *candidates], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_the_venv_gets_a_python_311_where_the_systems_is_older(tmp_path):
    bin_dir = tmp_path / "bin"
    old = bin_dir / "python3"  # Ubuntu 22.04's
    write(old, "#!/bin/sh\necho 3.10\nexit 1")
    old.chmod(old.stat().st_mode | stat.S_IEXEC)
    candidates = ("python3", "python3.12", "python3.11")
    assert find_python(bin_dir, *candidates) == ""  # none: the role installs python3.11
    (bin_dir / "python3.11").symlink_to(sys.executable)  # this one is 3.11+
    found, version = find_python(bin_dir, *candidates).split()
    assert (found, version) == (str(bin_dir / "python3.11"), f"3.{sys.version_info.minor}")


def test_nixl_s_build_follows_torchs_cuda(tmp_path):
    script = ROLES / "pdkit_python" / "files" / "mooncake_build.py"
    for cuda, package in {"13.0": "nixl-cu13", "12.8": "nixl-cu12"}.items():
        site = tmp_path / cuda / "site"
        write(site / "torch" / "__init__.py", "")
        write(site / "torch" / "version.py", f"cuda = {cuda!r}")
        done = subprocess.run(
            [sys.executable, str(script), "nixl"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(site)},
        )
        assert done.stdout.strip() == package, done.stderr
