"""Host faults that PD users meet at start-up, caught on the namespace bed before any worker
starts, each with the fix printed (#37): a locked-memory limit the workers cannot raise, a
firewall between a decode and its prefill's bootstrap port, SGLang/torch/Mooncake versions that
differ between hosts, and a node that cannot reach its rank 0's dist-init port.

One engine-sglang topology over hosts a (prefill), b and c (a decode of two nodes, rank 0 on
b). The faults are real where the bed allows it: host c's SSH sessions come from an sshd started
with a 64 KiB locked-memory limit and without CAP_SYS_RESOURCE (a container's case); the
firewall is policy routing in the namespaces (this machine has no iptables/nft): SYNs from b to
a's bootstrap port are dropped at a, and c is refused a route to b's dist-init port. Each
host's Python is a fake environment holding only distribution metadata (torch 2.13.0 on b),
like the fake nvidia-smi of test_provision_gpu_roles.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kit.plan.resolve import resolve
from tests.support.fake_hosts import PROPRIETARY, fake_device, fake_proc
from tests.support.multihost import run_pdkit
from tests.support.netns import SSHD, NetnsHost, TestBed

CONSTRAINED_SSH_PORT = 2222
VERSIONS = {"sglang": "0.5.23", "torch": "2.14.1", "mooncake_transfer_engine_cuda13": "0.3.7"}


def fake_python(host: NetnsHost, **versions: str) -> Path:
    """An interpreter on `host` that finds only these distributions (their metadata)."""
    folder = host.root / "fake-python"
    site = folder / "site"
    for name, version in {**VERSIONS, **versions}.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        dist = name.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    python = folder / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    return python


def constrained_sshd(bed: TestBed, host: NetnsHost) -> subprocess.Popen[bytes]:
    """A second sshd on `host` (port 2222) whose sessions have a 64 KiB locked-memory limit and
    no CAP_SYS_RESOURCE to raise it: `ulimit -l unlimited` fails there, as in a container."""
    config = (host.sshd_dir / "sshd_config").read_text()
    config = config.replace(f"{host.address}:{host.ssh_port}", f"{host.address}:2222")
    config = config.replace("sshd.pid", "sshd-2222.pid")
    path = host.sshd_dir / "sshd_config-2222"
    path.write_text(config)
    with bed.known_hosts.open("a") as known:
        known.write(f"[{host.address}]:{CONSTRAINED_SSH_PORT} {host.host_public_key}\n")
    sshd = shlex.join(
        [
            "prlimit",
            "--memlock=65536:65536",
            "setpriv",
            "--bounding-set=-sys_resource",
            SSHD,
            "-D",
            "-f",
            str(path),
            "-E",
            str(host.sshd_dir / "sshd-2222.log"),
        ]
    )
    mount = shlex.join(["mount", "--bind", str(host.home_dir), "/root"])
    proc = subprocess.Popen(
        host.exec_argv(["sh", "-c", f"{mount} && exec {sshd}"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        if host.listening(CONSTRAINED_SSH_PORT, timeout=0.2):
            return proc
        subprocess.run(["sleep", "0.1"], check=True)
    proc.kill()
    raise TimeoutError(f"the constrained sshd on {host.name} did not come up")


def ip_rule(host: NetnsHost, *args: str) -> None:
    done = host.run(["ip", "rule", *args])
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def faulty(testbed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The topology, with every fault in place; everything is undone at the end."""
    if shutil.which("prlimit") is None or shutil.which("setpriv") is None:
        pytest.skip("needs prlimit and setpriv (util-linux)")
    a, b, c = testbed.hosts[:3]
    folder = Path(tmp_path_factory.mktemp("preflight"))
    pythons = {a.name: fake_python(a), b.name: fake_python(b, torch="2.13.0")}
    pythons[c.name] = fake_python(c)
    ports = {a.name: a.ssh_port, b.name: b.ssh_port, c.name: CONSTRAINED_SSH_PORT}
    data = {
        "name": "preflight",
        "engine": "sglang",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "ssh": {"user": "root", "port": ports[h.name], "key": str(testbed.ssh_key)},
                "network_interface": "eth0",
                "gpus": 1,
                "rdma_devices": ["mlx5_0"],
                "service_manager": "supervisord",
                "root": str(h.root),
                "sglang_python": str(pythons[h.name]),
            }
            for h in (a, b, c)
        ],
        "prefill": {"count": 1, "hosts": [a.name]},
        "decode": {"count": 1, "tp": 2, "hosts": [b.name, c.name]},
        "transfer": {"backend": "mooncake"},
        "router": {"host": a.name, "bind": a.address},
    }
    topology = folder / "preflight.yaml"
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = resolve(topology)
    bootstrap = plan.role("prefill")[0].bootstrap_port
    rank0 = next(w for w in plan.workers if w.role == "decode" and w.node_rank == 0)
    dist_init = next(u.first for u in rank0.ports if u.what == "dist-init")

    sshd = constrained_sshd(testbed, c)
    # a drops b's SYNs to the bootstrap port (rules before the local table: a DROP firewall).
    drop = ["from", b.address, "iif", "eth0", "ipproto", "tcp", "dport", str(bootstrap)]
    ip_rule(a, "add", "priority", "5", *drop, "blackhole")
    ip_rule(a, "add", "priority", "100", "lookup", "local")
    ip_rule(a, "del", "priority", "0")
    # c may not route to b's dist-init port (a REJECT on the way out).
    reject = ["to", b.address, "ipproto", "tcp", "dport", str(dist_init)]
    ip_rule(c, "add", "priority", "5", *reject, "prohibit")
    try:
        yield topology
    finally:
        ip_rule(c, "del", "priority", "5")
        ip_rule(a, "add", "priority", "0", "lookup", "local")
        ip_rule(a, "del", "priority", "100")
        ip_rule(a, "del", "priority", "5")
        sshd.terminate()
        sshd.wait(timeout=10)
        for host in (a, b, c):
            shutil.rmtree(host.root / "fake-python", ignore_errors=True)


def rows(stdout: str) -> dict[tuple[str, str], str]:
    """(host, item) -> its table line."""
    out = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 4 and cells[0] in ("a", "b", "c"):
            out[cells[0], cells[1]] = line
    return out


def test_check_names_each_fault_and_its_fix_before_anything_starts(
    testbed: TestBed, faulty: Path, tmp_path: Path
):
    sysfs = tmp_path / "sys-class-infiniband"
    fake_device(sysfs, "mlx5_0", "4: ACTIVE", {})
    proc = fake_proc(tmp_path / "proc", ["nvidia", "nvidia_peermem"], PROPRIETARY, "5.15.0")
    extra = ["-e", f"pdkit_check_rdma_sysfs={sysfs}", "-e", f"pdkit_check_proc_dir={proc}"]
    check = run_pdkit(testbed, "provision", str(faulty), "--check", *extra)
    out = check.stdout + check.stderr
    assert check.returncode == 1, out
    table = rows(check.stdout)
    plan = resolve(faulty)
    bootstrap = plan.role("prefill")[0].bootstrap_port

    memlock = table["c", "locked memory"]
    assert "ulimit -l 64 KiB (hard 64 KiB), cannot be raised" in memlock and memlock.endswith(
        "FAIL"
    )
    # a and b have this machine's own limit: ok where it may be raised (root with
    # CAP_SYS_RESOURCE), FAIL in a container without it; either way not c's.
    assert "64 KiB" not in table["a", "locked memory"], out
    assert "c: locked memory: raise the hard locked-memory limit to unlimited" in out

    assert "torch 2.13.0 (a, c: 2.14.1)" in table["b", "versions"], out
    assert table["b", "versions"].endswith("FAIL") and table["a", "versions"].endswith("ok")
    assert "b: versions: install the same versions everywhere" in out

    assert f"a {bootstrap} (prefill-0 bootstrap) timeout" in table["b", "reachable ports"], out
    assert f"open TCP {bootstrap} on a ({testbed.host('a').address}) to b" in out
    dist_init = table["c", "reachable ports"]
    assert "(decode-0-node0 dist-init) unreachable" in dist_init, out
    assert "prefill-0 bootstrap" not in dist_init  # c reaches a's bootstrap port
    assert "c: reachable ports: c has no route to" in out
    assert table["a", "GPUDirect RDMA"].endswith("ok"), out


def test_up_stops_at_the_preflight_and_starts_nothing(testbed: TestBed, faulty: Path):
    up = run_pdkit(testbed, "up", str(faulty), "--no-gate", timeout=180)
    out = up.stdout + up.stderr
    assert up.returncode == 1, out
    assert "The reachability preflight failed: 2 of 4 route(s)" in out
    assert "Could not fetch prefill parallel info from bootstrap_addr" in out
    assert "until --dist-timeout" in out
    assert "Nothing was started." in out
    for host in testbed.hosts[:3]:
        assert not [c for c in host.processes().values() if "sglang" in c or "supervisord" in c]
