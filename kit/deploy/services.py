"""Ask a deployment's supervisord what its processes do: XML-RPC over its unix socket, from the
control machine. Only for hosts with `connection: local` and `service_manager: supervisord`; for
other hosts pdkit judges readiness by HTTP alone (over SSH this is issue #6's ground).

The standard library speaks XML-RPC; only the unix-socket transport is ours, so the control
machine needs no supervisor package to read the state.
"""

from __future__ import annotations

import http.client
import socket
import xmlrpc.client
from collections.abc import Iterable, Mapping
from typing import Any

from kit.deploy.inventory import DeployHost
from kit.deploy.readiness import ServiceInfo

RPC_TIMEOUT_S = 3.0


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


def supervisor_processes(
    socket_path: str, timeout: float = RPC_TIMEOUT_S
) -> dict[str, ServiceInfo] | None:
    """Every process supervisord at `socket_path` knows, by name; None when it does not run."""
    proxy = xmlrpc.client.ServerProxy(
        "http://localhost", transport=_UnixTransport(socket_path, timeout)
    )
    try:
        infos: list[Mapping[str, Any]] = proxy.supervisor.getAllProcessInfo()  # type: ignore[assignment]
    except (OSError, xmlrpc.client.Error, http.client.HTTPException):
        return None
    return {info.name: info for info in map(service_info, infos)}


def can_probe(host: DeployHost) -> bool:
    """Whether pdkit can ask this host's service manager directly."""
    return host.local and host.plan.service_manager == "supervisord"


def host_processes(host: DeployHost) -> dict[str, ServiceInfo] | None:
    """The supervisord view of a local host, or None (cannot ask, or supervisord is down)."""
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
