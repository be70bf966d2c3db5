"""A real 3-node Slurm on one machine: Debian's slurmctld, three slurmd, munge, fake GPUs.

    root namespace: munged, slurmctld (SlurmctldHost = this machine on the bridge), pdkit
      bridge pkslurm0   10.213.N.1/24
        ├── veth ── netns pdkit-slurm-n1   10.213.N.11   UTS hostname n1   slurmd
        ├── veth ── netns pdkit-slurm-n2   10.213.N.12   UTS hostname n2   slurmd
        └── veth ── netns pdkit-slurm-n3   10.213.N.13   UTS hostname n3   slurmd

Every node has `Gres=gpu:4` over character devices (major 195, NVIDIA's, under the cluster's
folder; nothing opens them), so `--gpus-per-node` sets CUDA_VISIBLE_DEVICES as on a GPU node.
A job's processes live in their node's network namespace and share the machine's file system
(venvs, the state folder). Each slurmd is started with `nsenter --net` and `unshare --uts`:
`ip netns exec` remounts /sys, and slurmd's cgroup plugin then finds no cgroup file system.

The cluster's files (slurm.conf, gres.conf, cgroup.conf, state, logs, pid files) live in one
folder, `DEFAULT_DIR` unless PDKIT_SLURM_DIR says otherwise; clients find it through
SLURM_CONF (`slurm_env`). `up` is idempotent (a running cluster is left as it is) and `down`
leaves no daemon, namespace or bridge. As a script: `python -m tests.support.slurm_cluster
up|down|env` (make slurm-up, make slurm-down).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kit.lb.processes import pid_running
from tests.support.netns import _free_subnet, _ip, _locked, kill_namespace_processes

DEFAULT_DIR = Path("/tmp/pdkit-slurm")
NODES = ("n1", "n2", "n3")
GPUS_PER_NODE = 4
CPUS_PER_NODE = 8
"""Slurm's view only (CR_Core, oversubscribed): a node offers 8 CPUs so that one job step per
process fits, whatever this machine has."""
PARTITION = "debug"
BRIDGE = "pkslurm0"
NETNS_PREFIX = "pdkit-slurm-"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"


class SlurmUnavailable(Exception):
    """This machine cannot run the local Slurm cluster (not root, packages missing)."""


def unavailable_reason() -> str | None:
    """Why the cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (network namespaces, slurmd)"
    for binary in (SLURMCTLD, SLURMD, MUNGED):
        if not Path(binary).exists():
            return f"{binary} is missing: install {' '.join(PACKAGES)} (make os-packages)"
    for tool in ("ip", "nsenter", "unshare", "sinfo"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


@dataclass(frozen=True)
class SlurmCluster:
    """The cluster's folder and what `up` wrote there."""

    folder: Path = DEFAULT_DIR

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def info_file(self) -> Path:
        return self.folder / "cluster.json"

    def env(self) -> dict[str, str]:
        """What Slurm's clients (sinfo, sbatch, pdkit) need to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def info(self) -> dict[str, object]:
        """{"subnet", "gateway", "nodes": {name: address}} of the running cluster."""
        data: dict[str, object] = json.loads(self.info_file.read_text())
        return data

    def node_addresses(self) -> dict[str, str]:
        nodes = self.info()["nodes"]
        assert isinstance(nodes, dict)
        return {str(k): str(v) for k, v in nodes.items()}

    # -- state -------------------------------------------------------------------------------

    def _pid_files(self) -> list[Path]:
        return [self.folder / f"slurmd-{n}.pid" for n in NODES] + [self.folder / "slurmctld.pid"]

    def _daemon_pids(self) -> list[int]:
        pids = []
        for pid_file in self._pid_files():
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().strip())
                if pid_running(pid):
                    pids.append(pid)
        return pids

    def sinfo(self, fmt: str = "%n %T") -> str:
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", fmt],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, **self.env()},
            check=False,
        )
        return result.stdout if result.returncode == 0 else ""

    def idle(self) -> bool:
        """Whether every node is up and idle (or running jobs: `mixed`/`allocated`)."""
        states = [line.split()[1] for line in self.sinfo().splitlines() if line.split()]
        usable = {"idle", "mixed", "allocated"}
        return len(states) == len(NODES) and all(s in usable for s in states)

    def running(self) -> bool:
        return len(self._daemon_pids()) == len(NODES) + 1 and self.idle()

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self, timeout: float = 30.0) -> SlurmCluster:
        """Start the cluster (nothing when it already runs); wait until every node is idle."""
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
        if self.running():
            return self
        self.down()
        self.folder.mkdir(parents=True, exist_ok=True)
        with _locked():
            subnet = _free_subnet()
            gateway = str(subnet.network_address + 1)
            _ip("link", "add", BRIDGE, "type", "bridge")
            _ip("addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", BRIDGE)
            _ip("link", "set", BRIDGE, "up")
        nodes = {name: str(subnet.network_address + 11 + i) for i, name in enumerate(NODES)}
        self.info_file.write_text(
            json.dumps({"subnet": str(subnet), "gateway": gateway, "nodes": nodes}, indent=2)
        )
        for index, (name, address) in enumerate(nodes.items()):
            _make_node(index, name, address, subnet.prefixlen)
        self._write_config(gateway, nodes)
        _start_munged()
        env = {**os.environ, **self.env()}
        subprocess.run([SLURMCTLD, "-f", str(self.conf)], check=True, env=env, timeout=30)
        for name in nodes:
            slurmd = f"hostname {name} && exec {SLURMD} -f {self.conf}"
            argv = ["nsenter", f"--net=/run/netns/{NETNS_PREFIX}{name}", "unshare", "--uts"]
            subprocess.run([*argv, "sh", "-c", slurmd], check=True, env=env, timeout=30)
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() > deadline:
                raise SlurmUnavailable(
                    f"the nodes are not idle after {timeout:.0f} s:\n{self.sinfo()}"
                )
            time.sleep(0.2)
        return self

    def down(self) -> None:
        """Cancel every job, stop the daemons, delete the namespaces and the bridge."""
        if self.conf.exists() and self._daemon_pids():
            subprocess.run(
                ["scancel", "--full", "--user", "root"],
                env={**os.environ, **self.env()},
                capture_output=True,
                timeout=10,
                check=False,
            )
        for pid in self._daemon_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self._daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in NODES:
            netns = f"{NETNS_PREFIX}{name}"
            if Path(f"/run/netns/{netns}").exists():
                kill_namespace_processes(netns)
                _ip("netns", "del", netns, check=False)
        _ip("link", "del", BRIDGE, check=False)
        for pid_file in self._pid_files():
            pid_file.unlink(missing_ok=True)
        # The controller's saved jobs would come back at the next start.
        shutil.rmtree(self.folder / "state", ignore_errors=True)

    def _write_config(self, gateway: str, nodes: dict[str, str]) -> None:
        folder = self.folder
        dev = folder / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(GPUS_PER_NODE):
            device = dev / f"fakegpu{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, i))
        for sub in ("state", *(f"spool/{n}" for n in nodes)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=pdkit",
            f"SlurmctldHost={socket.gethostname()}({gateway})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={folder}/state",
            f"SlurmdSpoolDir={folder}/spool/%n",
            f"SlurmctldPidFile={folder}/slurmctld.pid",
            f"SlurmdPidFile={folder}/slurmd-%n.pid",
            f"SlurmctldLogFile={folder}/slurmctld.log",
            f"SlurmdLogFile={folder}/slurmd-%n.log",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",
            "MpiDefault=none",
            "ReturnToService=2",
            # The nodes offer CPUS_PER_NODE whatever this machine has.
            "SlurmdParameters=config_overrides",
            # A step or job that ends is gone at once: scancel's processes get SIGKILL 2 s
            # after SIGTERM, and the node is free for the next test.
            "KillWait=2",
            "MinJobAge=2",
            "GresTypes=gpu",
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES",
            "",
        ]
        self.conf.write_text("\n".join(_node_lines(lines, nodes)))
        (folder / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={','.join(nodes)} Name=gpu "
            f"File={dev}/fakegpu[0-{GPUS_PER_NODE - 1}]\n"
        )
        (folder / "cgroup.conf").write_text(
            "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainDevices=yes\n"
        )


def _node_lines(lines: list[str], nodes: dict[str, str]) -> list[str]:
    """slurm.conf with one NodeName line per node (its own address)."""
    out = [line for line in lines if not line.startswith("NodeName=")]
    at = next(i for i, line in enumerate(out) if line.startswith("PartitionName="))
    node_lines = [
        f"NodeName={name} NodeAddr={address} CPUs={CPUS_PER_NODE} RealMemory=8000 "
        f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for name, address in nodes.items()
    ]
    return out[:at] + node_lines + out[at:]


def _make_node(index: int, name: str, address: str, prefixlen: int) -> None:
    netns, veth, peer = f"{NETNS_PREFIX}{name}", f"pkslv{index}", f"pkslp{index}"
    _ip("netns", "add", netns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
    _ip("link", "set", veth, "master", BRIDGE)
    _ip("link", "set", veth, "up")
    _ip("link", "set", peer, "netns", netns)
    inside = ["ip", "-n", netns]
    for argv in (
        [*inside, "link", "set", peer, "name", "eth0"],
        [*inside, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0"],
        [*inside, "link", "set", "eth0", "up"],
        [*inside, "link", "set", "lo", "up"],
    ):
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def _start_munged() -> None:
    """munged as the munge user, unless one runs (Debian's package made the key)."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True, check=False).returncode == 0:
        return
    run_dir = Path("/run/munge")
    run_dir.mkdir(exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", MUNGED], check=True, timeout=30)


def main(argv: list[str]) -> int:
    cluster = SlurmCluster(Path(os.environ.get("PDKIT_SLURM_DIR", DEFAULT_DIR)))
    command = argv[0] if argv else "up"
    if command == "up":
        started = time.monotonic()
        try:
            cluster.up()
        except SlurmUnavailable as exc:
            print(f"slurm-up: {exc}", file=sys.stderr)
            return 1
        print(
            f"Slurm up in {time.monotonic() - started:.1f} s: {cluster.sinfo('%n %T %G')}".strip()
        )
        print(f"export SLURM_CONF={cluster.conf}")
    elif command == "down":
        cluster.down()
        print("Slurm down: no daemon, namespace or bridge left")
    elif command == "env":
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        print("usage: python -m tests.support.slurm_cluster up|down|env", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
