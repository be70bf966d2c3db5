"""Ask a host's service manager what the deployment's processes do, from the control machine.

supervisord: XML-RPC over its unix socket, on hosts with `connection: local` (the standard
library speaks XML-RPC; only the unix-socket transport is ours). systemd: `systemctl show` of
the processes' units (ActiveState, SubState, Result, NRestarts, the main process's PID, status
and start time), run on the host itself or over SSH with the topology's settings, on any host
with `service_manager: systemd`. Other hosts (supervisord over SSH) are judged by HTTP alone.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import xmlrpc.client
from collections.abc import Iterable, Mapping
from typing import Any

from kit.deploy.readiness import ServiceInfo
from kit.hosts.inventory import DeployHost
from kit.hosts.logs import ssh_argv

RPC_TIMEOUT_S = 3.0
SYSTEMCTL_TIMEOUT_S = 10.0
SYSTEMD_PROPERTIES = (
    "Id",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "ExecMainPID",
    "ExecMainStatus",
    "ExecMainStartTimestamp",
    "ExecMainExitTimestamp",
)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        self._path = path
        self._timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self._path, self._timeout)


def service_info(raw: Mapping[str, Any]) -> ServiceInfo:
    """One entry of supervisord's getAllProcessInfo() as a ServiceInfo."""
    return ServiceInfo(
        name=str(raw.get("name", "")),
        state=str(raw.get("statename", "UNKNOWN")),
        pid=int(raw.get("pid") or 0),
        start=float(raw.get("start") or 0),
        stop=float(raw.get("stop") or 0),
        exit_status=int(raw.get("exitstatus") or 0),
        description=str(raw.get("spawnerr") or raw.get("description") or ""),
    )


def supervisor_proxy(socket_path: str, timeout: float = RPC_TIMEOUT_S) -> xmlrpc.client.ServerProxy:
    """supervisord's XML-RPC interface on its unix socket `socket_path`."""
    return xmlrpc.client.ServerProxy(
        "http://localhost", transport=_UnixTransport(socket_path, timeout)
    )


def supervisor_processes(
    socket_path: str, timeout: float = RPC_TIMEOUT_S
) -> dict[str, ServiceInfo] | None:
    """Every process supervisord at `socket_path` knows, by name; None when it does not run."""
    proxy = supervisor_proxy(socket_path, timeout)
    try:
        infos: list[Mapping[str, Any]] = proxy.supervisor.getAllProcessInfo()  # type: ignore[assignment]
    except (OSError, xmlrpc.client.Error, http.client.HTTPException):
        return None
    return {info.name: info for info in map(service_info, infos)}


def systemctl_show_argv(units: Iterable[str]) -> list[str]:
    """`systemctl show` of `units`, times as @epoch seconds (systemd 248+: Ubuntu 22.04 has 249)."""
    return [
        "systemctl",
        "show",
        "--timestamp=unix",
        f"--property={','.join(SYSTEMD_PROPERTIES)}",
        *units,
    ]


def parse_systemctl_show(text: str) -> list[dict[str, str]]:
    """`systemctl show` output: one block of NAME=VALUE lines per unit, blank lines between."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        name, _, value = line.partition("=")
        blocks[-1][name] = value
    return [b for b in blocks if b]


def _epoch(value: str) -> float:
    return float(value[1:]) if value.startswith("@") and value[1:].replace(".", "").isdigit() else 0


def systemd_info(name: str, props: Mapping[str, str]) -> ServiceInfo:
    """One unit's `systemctl show` properties as a ServiceInfo (states mapped onto
    supervisord's: failed -> FATAL, auto-restart -> BACKOFF, active -> RUNNING, ...)."""
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    result = props.get("Result", "")
    restarts = int(props.get("NRestarts") or 0)
    stop = _epoch(props.get("ExecMainExitTimestamp", ""))
    description = f"result {result}" if result and result != "success" else ""
    if active == "failed":
        state = "FATAL"
        if result == "start-limit-hit":
            description = (
                f"a crash loop: it failed {restarts + 1} time(s) and hit its start limit "
                "(StartLimitBurst), so systemd stopped restarting it"
            )
    elif active == "activating" and sub == "auto-restart":
        state = "BACKOFF"
        description = f"it exited and systemd restarts it ({restarts} restart(s) so far)"
    elif active in ("activating", "reloading"):
        state = "STARTING"
    elif active == "active":
        state = "RUNNING"
    elif active == "deactivating":
        state = "STOPPING"
    else:
        state = "EXITED" if stop else "STOPPED"
    return ServiceInfo(
        name=name,
        state=state,
        pid=int(props.get("ExecMainPID") or 0),
        start=_epoch(props.get("ExecMainStartTimestamp", "")),
        stop=stop,
        exit_status=int(props.get("ExecMainStatus") or 0),
        description=description,
        manager="systemd",
        restarts=restarts,
        shown=f"{active}/{sub}" if sub else active,
    )


def systemd_processes(
    host: DeployHost, units: Mapping[str, str], timeout: float = SYSTEMCTL_TIMEOUT_S
) -> dict[str, ServiceInfo] | None:
    """The systemd view of `units` (unit -> process name) on `host`, by process name; None when
    systemctl cannot be run there (no SSH, no systemd)."""
    if not units:
        return {}
    argv = systemctl_show_argv(units)
    command = argv if host.local else ssh_argv(host, argv)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    found = {}
    for props in parse_systemctl_show(done.stdout):
        name = units.get(props.get("Id", ""))
        if name is not None:
            found[name] = systemd_info(name, props)
    return found


def can_probe(host: DeployHost) -> bool:
    """Whether pdkit can ask this host's supervisord directly."""
    return host.local and host.plan.service_manager == "supervisord"


def host_processes(
    host: DeployHost, units: Mapping[str, str] | None = None
) -> dict[str, ServiceInfo] | None:
    """The service manager's view of a host, or None (cannot ask, or supervisord is down):
    supervisord on a local host; systemd on any host when `units` (unit -> process name) says
    which units to read."""
    if host.plan.service_manager == "systemd" and units:
        return systemd_processes(host, units)
    if not can_probe(host):
        return None
    return supervisor_processes(host.layout.supervisord_socket)


def local_pids(hosts: Iterable[DeployHost]) -> dict[str, int]:
    """The running processes supervisord reports on the local hosts: name -> pid (hosts it
    cannot ask are left out)."""
    pids: dict[str, int] = {}
    for host in hosts:
        for name, info in (host_processes(host) or {}).items():
            if info.state == "RUNNING" and info.pid:
                pids[name] = info.pid
    return pids
