"""A multi-host test bed on one machine: network namespaces as hosts, each with its own sshd.

    root namespace (pytest, Ansible, the openai client)
      bridge pkbr<id>   10.213.N.1/24
        ├── veth ── netns pdkit-<id>-a   eth0 10.213.N.11/24   sshd on :22   root <base>/a/root
        ├── veth ── netns pdkit-<id>-b   eth0 10.213.N.12/24   sshd on :22   root <base>/b/root
        └── ...

Each namespace has only its loopback and its address on the bridge: no default route, so
nothing started in it can reach a package index. The namespaces share the machine's file
system, so every emulated host gets its own root prefix; a process started over SSH lives in
that host's namespace and binds that host's address. Root's home (/root) is a per-host folder,
bind-mounted in the sshd's private mount namespace, so the machine's shell setup stays out;
`exposed` folders under /root (the real engine's venv) are bound into it read-only, and
`private_shm` gives each host a /dev/shm of its own, as separate machines have.

Each sshd has its own host key, config and PidFile, allows key authentication only and runs as
root inside its namespace. The bed writes an SSH key pair, a known_hosts file with every host
key (strict host key checking works) and an ssh_config for `ssh -F`.

`TestBed.destroy()` kills every process in the namespaces (sshd, and whatever a test started
over SSH), deletes the namespaces and the bridge. Leftovers of a run that died (its pid is gone)
are removed at the next start. Only names with the `pdkit-` / `pkbr` prefix are ever touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.lb.processes import pid_running

SUBNET_PREFIX = "10.213"
"""Test subnets are 10.213.N.0/24, N picked free per run, so concurrent runs do not clash."""
NETNS_PREFIX = "pdkit-"
BRIDGE_PREFIX = "pkbr"
VETH_PREFIX = "pkv"
PEER_PREFIX = "pkp"
SSHD = "/usr/sbin/sshd"
LOCK_FILE = Path("/run/pdkit-testbed.lock")


_SEQUENCE = iter("abcdefghijklmnopqrstuvwxyz")
"""Beds made by one process get ids <pid><letter>; interface names stay under 15 characters."""


class TestBedUnavailable(Exception):
    """This machine cannot host the test bed (not root, no `ip netns`, no sshd)."""

    __test__ = False


def unavailable_reason() -> str | None:
    """Why the test bed cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces, sshd)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if not Path(SSHD).exists():
        return f"{SSHD} (openssh-server) is not installed"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "ssh / ssh-keygen (openssh-client) is not installed"
    probe = f"{NETNS_PREFIX}probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` fails here: {exc.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def _netns_pids(netns: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]


def _pid_alive(pid: int) -> bool:
    return pid_running(pid)


@dataclass(frozen=True)
class NetnsHost:
    """One emulated host: a namespace, its address, its sshd files and its root prefix."""

    name: str
    netns: str
    address: str
    veth: str
    home: Path
    ssh_port: int = 22

    @property
    def root(self) -> Path:
        """The host's root prefix (the topology's `hosts[].root`)."""
        return self.home / "root"

    @property
    def home_dir(self) -> Path:
        """Mounted over /root for everything that runs on the host (its own ~/.ansible, ...)."""
        return self.home / "home-root"

    @property
    def bin_dir(self) -> Path:
        """First on PATH in the host's SSH sessions: for fake tools (nvidia-smi, ...)."""
        return self.home / "bin"

    @property
    def sshd_dir(self) -> Path:
        return self.home / "sshd"

    @property
    def host_public_key(self) -> str:
        return (self.sshd_dir / "ssh_host_ed25519_key.pub").read_text().strip()

    def exec_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (as root, on the shared file system)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.exec_argv(argv), check=False, capture_output=True, text=True, timeout=timeout
        )

    def pids(self) -> list[int]:
        """Every process in this namespace (sshd included)."""
        return _netns_pids(self.netns)

    def processes(self) -> dict[int, str]:
        """pid -> command line of every process in the namespace except sshd itself and the
        sshd session processes serving Ansible's (persisted) connections."""
        out: dict[int, str] = {}
        for pid in self.pids():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # exited meanwhile
            if comm in {"sshd", "sshd-session"}:
                continue
            out[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        return out

    def listening(self, port: int, timeout: float = 1.0) -> bool:
        """Whether something accepts TCP connections on this host's address and `port`."""
        try:
            with socket.create_connection((self.address, port), timeout=timeout):
                return True
        except OSError:
            return False


@dataclass
class TestBed:
    """N namespace hosts on a private bridge, reachable over SSH from the root namespace."""

    __test__ = False  # not a pytest test class

    base: Path
    names: tuple[str, ...] = ("a", "b", "c")
    run_id: str = field(default_factory=lambda: f"{os.getpid()}{next(_SEQUENCE)}")
    exposed: tuple[Path, ...] = ()
    """Folders under the machine's /root that every host sees at the same path, read-only (the
    real engine's venv and its base interpreter: /root is otherwise the host's own)."""
    private_shm: bool = False
    """Each host its own /dev/shm, as separate machines have: SGLang takes ranks that see one
    /dev/shm segment for ranks of one node (`in_the_same_node_as`)."""
    hosts: list[NetnsHost] = field(default_factory=list)
    subnet: ipaddress.IPv4Network | None = None
    _sshd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.run_id}"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (the control machine, as hosts see it)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def ssh_key(self) -> Path:
        """Private key accepted by every host (root login)."""
        return self.base / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.base / "ssh" / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """Client config for `ssh -F`: strict host key checking against `known_hosts`."""
        return self.base / "ssh" / "config"

    def host(self, name: str) -> NetnsHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    # -- lifecycle ---------------------------------------------------------------------------

    def create(self) -> TestBed:
        """Build the bridge, the namespaces, keys and sshds; wait until every sshd answers."""
        reason = unavailable_reason()
        if reason:
            raise TestBedUnavailable(reason)
        remove_stale()
        try:
            with _locked():
                self.subnet = _free_subnet()
                self._make_bridge()
            self._make_client_keys()
            for index, name in enumerate(self.names):
                self.hosts.append(self._make_host(index, name))
            self._write_client_files()
            for host in self.hosts:
                self._start_sshd(host)
            for host in self.hosts:
                _wait_for(lambda h=host: h.listening(h.ssh_port), f"sshd on {host.address}:22")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Kill every process in the namespaces, delete them and the bridge. Safe to repeat."""
        for host in self.hosts:
            kill_namespace_processes(host.netns)
        for proc in self._sshd.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._sshd.clear()
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.veth, check=False)
        _ip("link", "del", self.bridge, check=False)

    # -- SSH from the control side -------------------------------------------------------------

    def ssh_argv(self, host: NetnsHost, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", host.name, command]

    def ssh(
        self, host: NetnsHost, command: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on `host` over real SSH."""
        return subprocess.run(
            self.ssh_argv(host, command),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ansible_env(self) -> dict[str, str]:
        """Environment for Ansible (and pdkit) on the control machine so that SSH checks the
        bed's host keys and nothing touches ~/.ssh."""
        return {
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_ARGS": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes "
                "-o ControlMaster=auto -o ControlPersist=60s"
            ),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.base / "ssh" / "cp"),
        }

    # -- building blocks -----------------------------------------------------------------------

    def _make_bridge(self) -> None:
        assert self.subnet is not None
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _make_host(self, index: int, name: str) -> NetnsHost:
        assert self.subnet is not None
        host = NetnsHost(
            name=name,
            netns=f"{NETNS_PREFIX}{self.run_id}-{name}",
            address=str(self.subnet.network_address + 11 + index),
            veth=f"{VETH_PREFIX}{self.run_id}{index}",
            home=self.base / "hosts" / name,
        )
        peer = f"{PEER_PREFIX}{self.run_id}{index}"
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("link", "set", peer, "netns", host.netns)
        inside = ["ip", "-n", host.netns]
        for argv in (
            [*inside, "link", "set", peer, "name", "eth0"],
            [*inside, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0"],
            [*inside, "link", "set", "eth0", "up"],
            [*inside, "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
        host.root.mkdir(parents=True, exist_ok=True)
        host.bin_dir.mkdir(parents=True, exist_ok=True)
        host.sshd_dir.mkdir(parents=True, exist_ok=True)
        _keygen(host.sshd_dir / "ssh_host_ed25519_key", f"pdkit-testbed host {name}")
        (host.sshd_dir / "authorized_keys").write_text(self.ssh_key.with_suffix(".pub").read_text())
        (host.sshd_dir / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}:{host.ssh_port}",
                    f"HostKey {host.sshd_dir / 'ssh_host_ed25519_key'}",
                    f"PidFile {host.sshd_dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {host.sshd_dir / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    # The bed lives under pytest's tmp dirs; their modes are not sshd's business.
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    "MaxStartups 50",
                    "MaxSessions 50",
                    "LogLevel ERROR",
                    # The host's own bin/ first: tests put fake tools there (nvidia-smi).
                    f"SetEnv PATH={host.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
                    "",
                ]
            )
        )
        return host

    def _make_client_keys(self) -> None:
        self.ssh_key.parent.mkdir(parents=True, exist_ok=True)
        (self.ssh_key.parent / "cp").mkdir(exist_ok=True)
        _keygen(self.ssh_key, "pdkit-testbed client")

    def _write_client_files(self) -> None:
        self.known_hosts.write_text(
            "".join(f"{h.address} {h.host_public_key}\n" for h in self.hosts)
        )
        blocks = [
            f"Host {h.name}\n  HostName {h.address}\n  Port {h.ssh_port}\n  User root\n"
            for h in self.hosts
        ]
        blocks.append(
            f"Host *\n  IdentityFile {self.ssh_key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  StrictHostKeyChecking yes\n"
            "  ConnectTimeout 10\n"
        )
        self.ssh_config.write_text("\n".join(blocks))
        self.ssh_key.chmod(0o600)

    def _start_sshd(self, host: NetnsHost) -> None:
        # sshd insists on its privilege separation directory; Debian's unit creates it at boot.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        # Root's home is the host's own: the machine's ~/.bashrc (pyenv and the like) is not what
        # a fresh host has. `ip netns exec` gives the sshd a private mount namespace (slave to
        # the machine's), so this bind mount is seen only by the sshd and what it starts.
        host.home_dir.mkdir(mode=0o700, exist_ok=True)
        sshd = shlex.join(
            [
                SSHD,
                "-D",
                "-f",
                str(host.sshd_dir / "sshd_config"),
                "-E",
                str(host.sshd_dir / "sshd.log"),
            ]
        )
        mounts = [self._expose(host, path) for path in self.exposed]
        mounts.append(shlex.join(["mount", "--rbind", str(host.home_dir), "/root"]))
        if self.private_shm:
            mounts.append("mount -t tmpfs -o mode=1777 pdkit-shm /dev/shm")
        log = (host.sshd_dir / "sshd.log").open("ab")
        with log:
            self._sshd[host.name] = subprocess.Popen(
                host.exec_argv(["sh", "-c", " && ".join([*mounts, f"exec {sshd}"])]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def _expose(self, host: NetnsHost, path: Path) -> str:
        """The shell line that binds the machine's `path` (under /root), read-only, at the same
        place in the host's home, before that home covers /root."""
        inside = host.home_dir / path.relative_to("/root")
        inside.mkdir(parents=True, exist_ok=True)
        bind = shlex.join(["mount", "--bind", str(path), str(inside)])
        return f"{bind} && {shlex.join(['mount', '-o', 'remount,bind,ro', str(inside)])}"


def _keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not come up within {timeout:.0f} s")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialize subnet allocation between concurrent test runs on one machine."""
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    used = set(re.findall(rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-4", "addr").stdout))
    for third in range(256):
        if str(third) not in used:
            return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{third}.0/24")
    raise TestBedUnavailable(f"no free {SUBNET_PREFIX}.N.0/24 subnet left")


def kill_namespace_processes(netns: str, grace: float = 5.0) -> None:
    """SIGTERM every process in `netns`, then SIGKILL what is left after `grace` seconds."""
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while True:
        pids = _netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL and time.monotonic() > deadline + grace:
            return  # unkillable (D state); give up rather than hang the suite
        time.sleep(0.1)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL


def remove_stale() -> None:
    """Remove namespaces and bridges left by earlier test runs whose process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{re.escape(NETNS_PREFIX)}(\d+)[a-z]-.+", name)
        if match and not _pid_alive(int(match.group(1))):
            kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
    for name in re.findall(rf"^\d+: ({BRIDGE_PREFIX}\d+[a-z])[:@]", _ip("-o", "link").stdout, re.M):
        if not _pid_alive(int(name.removeprefix(BRIDGE_PREFIX)[:-1])):
            _ip("link", "del", name, check=False)
