"""`pdkit provision --check`: what each host is asked (from the Plan), how what it answered is
judged item by item, the exit code, and the probe itself run on this machine."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from kit.hosts.context import load_context
from kit.hosts.hostcheck import (
    ITEMS,
    MOONCAKE_DISTRIBUTIONS,
    check_spec,
    compare_versions,
    exit_code,
    judge,
    judge_all,
    table,
)
from tests.conftest import REPO, base_topology

PROBE = REPO / "playbooks/roles/pdkit_check/files/host_check.py"

GOOD_HOST = {
    "os": {
        "system": "Linux",
        "machine": "x86_64",
        "glibc": "2.35",
        "pretty_name": "Ubuntu 22.04.4 LTS",
    },
    "interpreter": {"path": "/usr/bin/python3.11", "version": "3.11.9", "headers": True},
    "interpreters_tried": ["/usr/bin/python3 3.10.12", "/usr/bin/python3.11 3.11.9"],
    "gcc": {"path": "/usr/bin/gcc", "version": "11.4.0"},
    "nvcc": None,
    "python": {
        "path": "/opt/pdkit/venv/bin/python",
        "distributions": {"sglang": "0.5.23"},
        "executables": {},
    },
    "listening": [],
    "memlock": {"soft": 65536, "hard": -1, "raisable": True},
}
GOOD_RDMA = {
    "devices": [{"name": f"mlx5_{i}"} for i in range(8)],
    "active_devices": [f"mlx5_{i}" for i in range(8)],
    "devices_with_gid_index": [],
    "gpudirect": {"nvidia_peermem": True, "dmabuf": False, "driver": "", "kernel": "6.8.0"},
}
GOOD_GPU = {
    "ok": True,
    "driver_version": "580.95.05",
    "driver_branch": "580",
    "cuda_version": "13.0",
    "gpus": [{"index": i} for i in range(8)],
}


def facts(rdma: dict | None = None, **host) -> dict:
    return {
        "host": {**GOOD_HOST, **host},
        "nvidia": GOOD_GPU,
        "rdma": {**GOOD_RDMA, **(rdma or {})},
    }


def verdicts(items) -> dict[str, str]:
    return {i.item: i.verdict for i in items}


@pytest.fixture
def ctx(write_topology):
    return load_context(write_topology(base_topology()), control_python="/ctl/venv/bin/python")


def test_a_ready_gpu_host_passes_every_item_that_applies(ctx):
    items = judge(ctx.plan, ctx.host("a"), facts())
    assert verdicts(items) == {
        "OS": "ok",
        "NVIDIA driver": "ok",
        "Python 3.11+": "ok",
        "Python.h": "ok",
        "gcc": "ok",
        "SGLang": "ok",
        "ports": "ok",
        "locked memory": "ok",
        "RDMA devices": "ok",
        "GPUDirect RDMA": "ok",
    }
    assert exit_code(items) == 0
    driver = next(i for i in items if i.item == "NVIDIA driver")
    assert driver.found == "580.95.05 (CUDA 13.0), 8 GPU(s)"


def test_an_old_driver_fails_naming_what_it_found_and_what_is_needed(ctx):
    old = {
        **GOOD_GPU,
        "driver_version": "570.86.15",
        "driver_branch": "570",
        "cuda_version": "12.8",
    }
    items = judge(ctx.plan, ctx.host("a"), {"host": GOOD_HOST, "nvidia": old})
    driver = next(i for i in items if i.item == "NVIDIA driver")
    assert (driver.verdict, driver.found) == ("fail", "570.86.15 (CUDA 12.8), 8 GPU(s)")
    assert driver.needed.startswith("branch 580+")
    assert "nvidia-driver-580-server" in driver.fix
    assert exit_code(items) == 1
    lines = table(items)
    assert lines[0].split() == ["host", "item", "needs", "found", "verdict"]
    assert any(
        line.startswith("a ") and "NVIDIA driver" in line and line.endswith("FAIL")
        for line in lines
    )


def test_what_provisioning_installs_is_marked_so_unless_it_may_not_install(ctx):
    bare = facts(interpreter=None, gcc=None, python={"path": "/opt/pdkit/venv/bin/python"})
    items = judge(ctx.plan, ctx.host("a"), bare)
    assert {k: v for k, v in verdicts(items).items() if v != "ok"} == {
        "Python 3.11+": "install",
        "Python.h": "install",
        "gcc": "install",
        "SGLang": "install",
    }
    assert exit_code(items) == 2
    python = next(i for i in items if i.item == "Python 3.11+")
    assert python.found == "/usr/bin/python3 3.10.12, /usr/bin/python3.11 3.11.9"

    by_hand = judge(ctx.plan, ctx.host("a"), bare, {"pdkit_base_install_packages": False})
    assert verdicts(by_hand)["gcc"] == "fail" and verdicts(by_hand)["Python 3.11+"] == "fail"
    assert exit_code(by_hand) == 1


def test_a_port_of_the_plan_held_by_another_process_fails_naming_it(ctx):
    prefill = ctx.plan.on_host("a")[0]
    other = {"port": prefill.http_port, "pid": 812, "command": "nginx: master", "deployment": ""}
    ours = {
        "port": prefill.bootstrap_port,
        "pid": 900,
        "command": "python -m sglang...",
        "deployment": ctx.plan.name,
        "process": prefill.name,
    }
    rpc = [{"port": p, "pid": 5, "command": "x", "deployment": ""} for p in range(15000, 15100)]
    items = judge(ctx.plan, ctx.host("a"), facts(listening=[other, ours, *rpc]))
    port = next(i for i in items if i.item == "ports")
    assert port.verdict == "fail"
    assert (
        port.found == f"{prefill.http_port} ({prefill.name} HTTP) held by pid 812 (nginx: master)"
    )

    mine = judge(ctx.plan, ctx.host("a"), facts(listening=[ours]))
    assert next(i for i in mine if i.item == "ports").found == "free (1 held by this deployment)"


def test_fp8_models_need_nvcc_or_nvrtc_for_deepgemm(write_topology):
    data = base_topology()
    data["model"]["path"] = "deepseek-ai/DeepSeek-V3"
    data["model"]["trust_remote_code"] = True
    data["prefill"] = {"count": 1, "tp": 8, "hosts": ["a"]}
    data["decode"] = {"count": 1, "tp": 8, "hosts": ["b"]}
    path = write_topology(data)
    ctx = load_context(path, control_python="/ctl/venv/bin/python")
    assert check_spec(ctx.plan, ctx.host("a"), {})["pdkit_check_spec"]["nvcc"] is True
    missing = judge(ctx.plan, ctx.host("a"), facts())
    deepgemm = next(i for i in missing if i.item == "DeepGEMM compiler")
    assert deepgemm.verdict == "fail" and "SGLANG_DG_USE_NVRTC: '1'" in deepgemm.fix
    nvcc = judge(
        ctx.plan, ctx.host("a"), facts(nvcc={"path": "/usr/local/cuda/bin/nvcc", "version": "13.0"})
    )
    assert verdicts(nvcc)["DeepGEMM compiler"] == "ok"

    data["prefill"]["env"] = {"SGLANG_DG_USE_NVRTC": "1"}
    ctx = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    assert verdicts(judge(ctx.plan, ctx.host("a"), facts()))["DeepGEMM compiler"] == "ok"


def test_smg_on_the_router_host_and_nixl_on_worker_hosts(write_topology):
    data = base_topology()
    data["router"] = {"host": "b", "kind": "smg"}
    data["transfer"]["backend"] = "nixl"
    ctx = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    spec = check_spec(ctx.plan, ctx.host("b"), {})["pdkit_check_spec"]
    assert spec["executables"] == ["smg"]
    assert spec["distributions"] == ["sglang", "torch", *MOONCAKE_DISTRIBUTIONS, "nixl"]
    assert check_spec(ctx.plan, ctx.host("a"), {})["pdkit_check_spec"]["executables"] == []
    items = verdicts(judge(ctx.plan, ctx.host("b"), facts()))
    assert items["smg"] == "install" and items["nixl"] == "install"
    python = {
        "path": "/opt/pdkit/venv/bin/python",
        "executables": {"smg": "/opt/pdkit/venv/bin/smg"},
        "distributions": {"sglang": "0.5.23", "nixl": "1.5.1"},
    }
    ready = verdicts(judge(ctx.plan, ctx.host("b"), facts(python=python)))
    assert ready["smg"] == "ok" and ready["nixl"] == "ok"
    assert "smg" not in verdicts(judge(ctx.plan, ctx.host("a"), facts()))


def test_the_docs_checklist_names_every_item_the_check_verifies():
    text = (REPO / "docs/provisioning.md").read_text()
    checklist = text.split("## What a host needs", 1)[1].split("\n## ", 1)[0]
    listed = [line.split("**")[1] for line in checklist.splitlines() if line.startswith("- **")]
    assert listed == list(ITEMS)


def test_the_probe_reads_this_machine_and_names_who_holds_a_port(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    spec = {
        "candidates": ["no-such-python", sys.executable],
        "python": sys.executable,
        "distributions": ["pydantic", "no-such-distribution"],
        "executables": ["pytest"],
        "ports": [[port, port]],
        "nvcc": False,
    }
    try:
        done = subprocess.run(
            [sys.executable, str(PROBE), base64.b64encode(json.dumps(spec).encode()).decode()],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    finally:
        listener.close()
    found = json.loads(done.stdout)
    assert found["interpreter"]["path"] == sys.executable
    assert found["python"]["distributions"]["no-such-distribution"] is None
    assert found["python"]["distributions"]["pydantic"]
    assert found["python"]["executables"]["pytest"].endswith("/pytest")
    assert found["os"]["system"] == "Linux"
    [held] = found["listening"]
    assert (held["port"], held["pid"]) == (port, os.getpid())


def test_sglang_hosts_need_glibc_2_34_for_sglang_s_manylinux_2_34_wheel(ctx):
    focal = {**GOOD_HOST["os"], "glibc": "2.31", "pretty_name": "Ubuntu 20.04.6 LTS"}
    os_item = judge(ctx.plan, ctx.host("a"), facts(os=focal))[0]
    assert (os_item.item, os_item.verdict) == ("OS", "fail")
    assert os_item.needed == "Linux x86_64, glibc 2.34+ (manylinux_2_34 wheels)"
    assert "glibc 2.34 or newer" in os_item.fix


def _supervisord_ctx(write_topology):
    data = base_topology()
    for host in data["hosts"]:
        host["service_manager"] = "supervisord"
    data["transfer"]["gid_index"] = 3
    return load_context(write_topology(data), control_python="/ctl/venv/bin/python")


def test_a_locked_memory_limit_the_workers_cannot_raise_fails_before_they_start(write_topology):
    ctx = _supervisord_ctx(write_topology)
    rdma = {"devices_with_gid_index": [f"mlx5_{i}" for i in range(8)]}
    low = {"soft": 65536, "hard": 65536, "raisable": False}
    item = next(
        i
        for i in judge(ctx.plan, ctx.host("a"), facts(rdma, memlock=low))
        if i.item == "locked memory"
    )
    assert (item.verdict, item.found) == (
        "fail",
        "ulimit -l 64 KiB (hard 64 KiB), cannot be raised",
    )
    assert "limits.d/90-pdkit-memlock.conf" in item.fix and "Cannot allocate memory" in item.fix
    root = {"soft": 65536, "hard": 65536, "raisable": True}  # CAP_SYS_RESOURCE: ulimit -l works
    assert (
        verdicts(judge(ctx.plan, ctx.host("a"), facts(rdma, memlock=root)))["locked memory"] == "ok"
    )
    # systemd units set LimitMEMLOCK=infinity themselves.
    systemd = load_context(write_topology(base_topology()), control_python="/ctl/venv/bin/python")
    item = next(
        i
        for i in judge(systemd.plan, systemd.host("a"), facts(memlock=low))
        if i.item == "locked memory"
    )
    assert (item.verdict, item.found) == ("ok", "LimitMEMLOCK=infinity (unit)")


def test_missing_down_or_gid_less_nics_and_no_gpudirect_fail_naming_the_fix(write_topology):
    ctx = _supervisord_ctx(write_topology)
    assert check_spec(ctx.plan, ctx.host("a"), {})["pdkit_check_rdma"] is True
    assert check_spec(ctx.plan, ctx.host("a"), {})["pdkit_check_spec"]["gid_index"] == "3"
    rdma = {
        "devices": [{"name": "mlx5_0"}, {"name": "mlx5_1"}, {"name": "mlx5_2"}],
        "active_devices": ["mlx5_0", "mlx5_2"],
        "devices_with_gid_index": ["mlx5_0"],
        "gpudirect": {
            "nvidia_peermem": False,
            "dmabuf": False,
            "driver": "NVRM 580",
            "kernel": "5.4.0",
        },
    }
    items = {i.item: i for i in judge(ctx.plan, ctx.host("a"), facts(rdma))}
    nics = items["RDMA devices"]
    assert nics.verdict == "fail"
    assert nics.found == (
        "mlx5_3 missing; mlx5_1 has no ACTIVE port; mlx5_2 has no GID 3 "
        "(host has: mlx5_0, mlx5_1, mlx5_2)"
    )
    assert "pdkit discover T" in nics.fix
    direct = items["GPUDirect RDMA"]
    assert direct.verdict == "fail" and "modprobe nvidia_peermem" in direct.fix
    assert direct.found.startswith("nvidia_peermem not loaded, no dma-buf")
    dmabuf = {**rdma["gpudirect"], "dmabuf": True, "kernel": "6.8.0"}
    ok = verdicts(judge(ctx.plan, ctx.host("a"), facts({"gpudirect": dmabuf})))
    assert ok["GPUDirect RDMA"] == "ok"
    # Without an RDMA backend nothing registers GPU memory with a NIC: neither item applies.
    data = base_topology()
    data["transfer"]["backend"] = "mooncake_tcp"
    tcp = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    assert "GPUDirect RDMA" not in verdicts(judge(tcp.plan, tcp.host("a"), facts()))
    assert "locked memory" not in verdicts(judge(tcp.plan, tcp.host("a"), facts()))


def test_sglang_torch_and_mooncake_versions_are_compared_across_worker_hosts(ctx):
    def host_facts(torch: str) -> dict:
        dists = {"sglang": "0.5.23", "torch": torch, "mooncake-transfer-engine-cuda13": "0.3.7"}
        return facts(python={"path": "/opt/pdkit/venv/bin/python", "distributions": dists})

    same = {"a": host_facts("2.14.1"), "b": host_facts("2.14.1")}
    assert {i.verdict for i in compare_versions(ctx.plan, same)} == {"ok"}
    skew = {"a": host_facts("2.14.1"), "b": host_facts("2.13.0")}
    items = judge_all(ctx.plan, ctx.hosts, skew)
    versions = [i for i in items if i.item == "versions"]
    assert [(i.host, i.verdict) for i in versions] == [("a", "fail"), ("b", "fail")]
    assert versions[1].found == "torch 2.13.0 (a: 2.14.1)"
    assert "sglang==0.5.23" in versions[1].fix
    assert exit_code(items) == 1


def test_the_probe_says_whether_the_locked_memory_limit_can_be_raised(tmp_path):
    spec = base64.b64encode(json.dumps({"candidates": []}).encode()).decode()
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or shutil.which("prlimit") is None:
        pytest.skip("needs root, setpriv and prlimit to take CAP_SYS_RESOURCE away")
    # A container-like session: 64 KiB hard limit, no CAP_SYS_RESOURCE to go past it.
    argv = ["prlimit", "--memlock=65536:65536", setpriv, "--bounding-set=-sys_resource"]
    done = subprocess.run(
        [*argv, sys.executable, str(PROBE), spec],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout)["memlock"] == {"soft": 65536, "hard": 65536, "raisable": False}
