"""The GPU and RDMA roles over SSH on a namespace host, with a fake nvidia-smi and a fake sysfs
(this machine has neither GPU nor RDMA card): a missing driver, or one older than the 580
branch SGLang 0.5.23's CUDA 13 torch needs, fails with a clear message,
found GPUs and NICs are recorded as facts pdkit shows, persistence mode is turned on once, and
a NIC the topology names but that is down fails the run. The model role checks or copies the
weights."""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from tests.support.fake_hosts import PROPRIETARY, fake_device, fake_proc
from tests.support.multihost import run_pdkit
from tests.support.netns import NetnsHost, TestBed

FAKE_NVIDIA_SMI = """#!/bin/sh
# Two H100s; persistence mode is remembered in the host's home, like the driver would.
state="$HOME/nvidia-persistence"
pm=Disabled; [ -f "$state" ] && pm=Enabled
case "$1" in
  --query-gpu=*)
    echo "0, NVIDIA H100 80GB HBM3, @DRIVER@, $pm"
    echo "1, NVIDIA H100 80GB HBM3, @DRIVER@, $pm" ;;
  -pm) touch "$state"; echo "Persistence mode set" ;;
  *) echo "| NVIDIA-SMI @DRIVER@   Driver Version: @DRIVER@   CUDA Version: @CUDA@ |" ;;
esac
"""


def fake_nvidia_smi(host: NetnsHost, driver: str = "580.95.05", cuda: str = "13.0") -> None:
    """nvidia-smi on the host's PATH reporting two H100s on `driver` (SGLang 0.5.23's CUDA 13
    torch needs the 580 branch)."""
    tool = host.bin_dir / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI.replace("@DRIVER@", driver).replace("@CUDA@", cuda))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def gpu_topology(
    host: NetnsHost, key: Path, folder: Path, model: str = "meta-llama/Llama-3.1-8B-Instruct"
) -> Path:
    data = {
        "name": "gpu",
        "engine": "sglang",
        "model": {"path": model},
        "hosts": [
            {
                "name": host.name,
                "address": host.address,
                "ssh": {"key": str(key)},
                "gpus": 2,
                "rdma_devices": ["mlx5_0"],
                "service_manager": "supervisord",
                "root": str(host.root),
            }
        ],
        "transfer": {"backend": "mooncake", "gid_index": 3},
    }
    path = folder / "gpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def host_a(testbed: TestBed):
    """Host a of the shared bed, left as the test found it: what the test (or the playbooks it
    ran) adds under the host's root goes again, so that later tests see fresh hosts."""
    host = testbed.host("a")
    before = set(host.root.iterdir())
    yield host
    (host.bin_dir / "nvidia-smi").unlink(missing_ok=True)
    (host.home_dir / "nvidia-persistence").unlink(missing_ok=True)
    for path in set(host.root.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def test_gpu_and_rdma_roles(testbed: TestBed, host_a: NetnsHost, tmp_path: Path):
    topology = gpu_topology(host_a, testbed.ssh_key, tmp_path)
    sysfs = host_a.root / "sys-class-infiniband"
    peermem = fake_proc(host_a.root / "proc", ["nvidia_peermem"], PROPRIETARY, "5.15.0")
    only = ["--skip", "base", "--skip", "python", "--skip", "model"]
    only += ["-e", f"pdkit_rdma_sysfs={sysfs}", "-e", f"pdkit_rdma_proc={peermem}"]

    no_driver = run_pdkit(testbed, "provision", str(topology), *only)
    assert no_driver.returncode == 1
    assert "nvidia-smi does not work" in no_driver.stderr
    assert "To fix: install the driver" in no_driver.stderr

    gid = ("0000:0000:0000:0000:0000:ffff:0ad5:000b", "RoCE v2")
    fake_device(sysfs, "mlx5_0", "4: ACTIVE", {3: gid})
    fake_nvidia_smi(host_a, driver="570.86.15", cuda="12.8")
    old_driver = run_pdkit(testbed, "provision", str(topology), *only)
    assert old_driver.returncode == 1
    assert "a runs NVIDIA driver 570.86.15 (branch 570, CUDA 12.8)" in old_driver.stderr
    assert "needs driver branch 580 or newer" in old_driver.stderr

    fake_nvidia_smi(host_a)
    first = run_pdkit(testbed, "provision", str(topology), *only)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "a: 2 GPU(s) NVIDIA H100 80GB HBM3; driver 580.95.05, CUDA 13.0" in first.stdout
    assert "a: RDMA: mlx5_0 ACTIVE Ethernet" in first.stdout
    assert "Ensure persistence mode is on: changed" in first.stdout
    facts = json.loads((host_a.root / "var/lib/pdkit/facts/rdma.json").read_text())
    assert facts["devices_with_gid_index"] == ["mlx5_0"]
    assert (host_a.root / "var/lib/pdkit/facts/nvidia.json").exists()

    again = run_pdkit(testbed, "provision", str(topology), *only)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "no change: already provisioned" in again.stdout

    without = fake_proc(host_a.root / "proc-without", ["nvidia"], PROPRIETARY, "5.15.0")
    no_gpudirect = run_pdkit(
        testbed, "provision", str(topology), *only, "-e", f"pdkit_rdma_proc={without}"
    )
    assert no_gpudirect.returncode == 1
    assert "no GPUDirect RDMA: the nvidia_peermem module is not loaded" in no_gpudirect.stderr

    (sysfs / "mlx5_0/ports/1/state").write_text("1: DOWN\n")
    down = run_pdkit(testbed, "provision", str(topology), *only)
    assert down.returncode == 1
    assert "mlx5_0 named in the topology missing or without an ACTIVE port" in down.stderr


def test_model_weights_are_checked_at_their_path_or_copied_there(
    testbed: TestBed, host_a: NetnsHost, tmp_path: Path
):
    weights = host_a.root / "models" / "tiny"
    topology = gpu_topology(host_a, testbed.ssh_key, tmp_path, model=str(weights))
    only = ["--skip", "base", "--skip", "nvidia", "--skip", "rdma", "--skip", "python"]

    missing = run_pdkit(testbed, "provision", str(topology), *only)
    assert missing.returncode == 1
    assert f"{weights}/config.json does not exist" in missing.stderr

    source = tmp_path / "tiny"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}\n')
    (source / "model.safetensors").write_bytes(b"\0" * 1024)
    copy = [*only, "-e", "pdkit_model_source=copy", "-e", f"pdkit_model_copy_from={source}"]
    copied = run_pdkit(testbed, "provision", str(topology), *copy)
    assert copied.returncode == 0, copied.stdout + copied.stderr
    assert (weights / "model.safetensors").read_bytes() == b"\0" * 1024
    again = run_pdkit(testbed, "provision", str(topology), *copy)
    assert "no change: already provisioned" in again.stdout
    checked = run_pdkit(testbed, "provision", str(topology), *only)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_check_verifies_the_checklist_over_ssh_read_only(
    testbed: TestBed, host_a: NetnsHost, tmp_path: Path
):
    """`pdkit provision --check` on a fresh GPU host whose (fake) driver is of the 570 branch:
    the driver item fails naming it, SGLang is left to provisioning, nothing is written."""
    topology = gpu_topology(host_a, testbed.ssh_key, tmp_path)
    fake_nvidia_smi(host_a, driver="570.86.15", cuda="12.8")
    before = sorted(p.name for p in host_a.root.iterdir())
    check = run_pdkit(testbed, "provision", str(topology), "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    rows = {
        re.split(r"\s{2,}", line)[1]: line
        for line in check.stdout.splitlines()
        if line.startswith("a  ")
    }
    assert list(rows) == [
        "OS",
        "NVIDIA driver",
        "Python 3.11+",
        "Python.h",
        "gcc",
        "SGLang",
        "ports",
        "locked memory",
        "RDMA devices",
        "GPUDirect RDMA",
    ], check.stdout
    assert "570.86.15 (CUDA 12.8), 2 GPU(s)" in rows["NVIDIA driver"]
    assert rows["NVIDIA driver"].endswith("FAIL")
    assert rows["SGLang"].endswith("provision installs")
    assert rows["OS"].endswith("ok") and rows["ports"].endswith("ok")
    assert "a: NVIDIA driver: install the 580 driver" in check.stdout
    assert sorted(p.name for p in host_a.root.iterdir()) == before
