"""Reachability preflight: every port a host must reach on another host, tried before the
deployment starts there (`pdkit provision --check`, and `pdkit up` before a first run's workers).

A decode that cannot reach a prefill's bootstrap port fails every request of that pair
("Could not fetch prefill parallel info from bootstrap_addr"), and a node that cannot reach
its rank 0's dist-init port hangs at start-up until `--dist-timeout`. Both are found in seconds
here, before a worker loads a model:

1. `routes` (pure) reads the Plan's firewall rules (`WorkerProcess.ports`, `PortUse.reached_by`):
   a prefill's bootstrap port is reached by every decode host, a multi-node instance's
   dist-init port by the hosts of its other nodes. A host reaching itself is left out.
2. On every target host a listener (`reachprobe.py listen`, sent on stdin to the host's
   Python over SSH like the transfer test's probes) binds those ports for a few seconds; a port
   something already listens on (this deployment running) is left to it.
3. On every source host a connector tries all its routes at once, `CONNECT_TIMEOUT_S` each:
   ok, refused (nothing listens, or a firewall rejects), timeout (a firewall drops) or
   unreachable (no route, or a rule prohibits it).

`check_reach` returns one `Reach` per route; `failure_lines` says what to open. Callable over a
Plan and its hosts alone (a Slurm step can run it), no Ansible involved.
"""

from __future__ import annotations

import base64
import json
import select
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kit.hosts.inventory import DeployHost
from kit.hosts.logs import ssh_argv
from kit.hosts.playbook import host_script, start_host_script
from kit.topology.listeners import DECODE_HOSTS, INSTANCE_NODES
from kit.topology.plan_types import Plan

PROBE = "reachprobe.py"
PROBE_ROLE = "pdkit_check"
CONNECT_TIMEOUT_S = 3.0
LISTEN_START_S = 30.0
"""How long a listener may take to start (an SSH connection and a Python)."""
WHY = {
    DECODE_HOSTS: "the decode fetches the prefill's parallel info there; without it every "
    "request of the pair fails (`Could not fetch prefill parallel info from bootstrap_addr`)",
    INSTANCE_NODES: "the instance's nodes meet there (torch.distributed, and pdkit's rank group "
    "agents); without it the other ranks hang at start-up until --dist-timeout, or never start",
}


@dataclass(frozen=True)
class Route:
    """`source` host must reach `target` host at `address`:`port`, where `process` listens
    (binding `bind`) for `what` (the Plan's PortUse), under the rule `reached_by`."""

    source: str
    target: str
    address: str
    bind: str
    port: int
    process: str
    what: str
    reached_by: str

    def line(self) -> str:
        return (
            f"{self.source} -> {self.target} ({self.address}) port {self.port} "
            f"({self.process} {self.what})"
        )


@dataclass(frozen=True)
class Reach:
    """What happened on one route: state ok, refused, timeout, unreachable, or `no probe`
    (the listener or the connector could not run); `error` says more."""

    route: Route
    state: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def routes(plan: Plan) -> list[Route]:
    """Every (source host, port) the Plan says must be reached from another host. Pure."""
    by_instance: dict[str, list[str]] = {}
    for worker in plan.workers:
        by_instance.setdefault(worker.instance_name, []).append(worker.host)
    decode_hosts = list(dict.fromkeys(w.host for w in plan.workers if w.role == "decode"))
    # Local hosts share this machine's network; a Slurm plan's stand-in hosts (connection
    # local too) are nodes of their own.
    local = {h.name for h in plan.hosts if h.connection == "local" and plan.slurm is None}
    out = []
    for worker in plan.workers:
        for use in worker.ports:
            if use.reached_by == DECODE_HOSTS:
                sources = decode_hosts
            elif use.reached_by == INSTANCE_NODES:
                sources = list(dict.fromkeys(by_instance[worker.instance_name]))
            else:
                continue
            for source in sources:
                if source == worker.host or (source in local and worker.host in local):
                    continue
                out.append(
                    Route(
                        source=source,
                        target=worker.host,
                        address=worker.address,
                        bind=worker.bind,
                        port=use.first,
                        process=worker.name,
                        what=use.what,
                        reached_by=use.reached_by,
                    )
                )
    return out


HostCommand = Callable[[DeployHost, list[str]], list[str]]
"""How to run an argv on a host: `on_host` (itself on a local host, over SSH on another), or a
launcher's own way in (a Slurm job step on the node)."""


def on_host(host: DeployHost, command: list[str]) -> list[str]:
    """`command` run on `host`: as it is on a local host, over SSH on a remote one."""
    return command if host.local else ssh_argv(host, command)


def probe_argv(host: DeployHost, spec: Mapping[str, Any], run_on: HostCommand) -> list[str]:
    """The probe with `spec`, sent on stdin to the host's Python (any Python 3: stdlib only)."""
    encoded = base64.b64encode(json.dumps(spec).encode()).decode()
    return run_on(host, [host.python if host.local else "python3", "-", encoded])


class _Listener:
    def __init__(
        self, host: DeployHost, todo: Sequence[Route], serve_s: float, run_on: HostCommand
    ) -> None:
        counts: dict[tuple[str, int], int] = {}
        for route in todo:
            counts[route.bind, route.port] = counts.get((route.bind, route.port), 0) + 1
        spec = {
            "mode": "listen",
            "serve_s": serve_s,
            "ports": [{"bind": b, "port": p, "expect": n} for (b, p), n in counts.items()],
        }
        self.proc = start_host_script(probe_argv(host, spec, run_on), PROBE_ROLE, PROBE)

    def ready(self, timeout: float) -> dict[tuple[str, int], str]:
        """(bind, port) -> listening, in use, or why it could not bind; {} when it never
        answered (then `self.error` says why)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if readable:
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith("{"):
                    found = json.loads(line)["listening"]
                    return {(e["bind"], int(e["port"])): str(e["state"]) for e in found}
            elif self.proc.poll() is not None:
                break
        return {}

    @property
    def error(self) -> str:
        self.stop()
        text = self.proc.stderr.read() if self.proc.stderr else ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return (lines or ["no answer"])[-1][:300]

    def stop(self, wait_s: float = 0.0) -> None:
        """Let it end on its own within `wait_s` (every connection arrived), else end it."""
        try:
            self.proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _connect(
    host: DeployHost, todo: Sequence[Route], timeout_s: float, run_on: HostCommand
) -> list[Reach]:
    spec = {
        "mode": "connect",
        "timeout_s": timeout_s,
        "targets": [{"address": r.address, "port": r.port} for r in todo],
    }
    try:
        done = subprocess.run(
            probe_argv(host, spec, run_on),
            input=host_script(PROBE_ROLE, PROBE),
            capture_output=True,
            text=True,
            timeout=LISTEN_START_S + timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [Reach(r, "no probe", f"no answer from {host.name}") for r in todo]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return [Reach(r, "no probe", f"the probe on {host.name} failed: {why}") for r in todo]
    found = {(e["address"], int(e["port"])): e for e in json.loads(lines[-1])["results"]}
    out = []
    for route in todo:
        entry = found[route.address, route.port]
        out.append(Reach(route, str(entry["state"]), str(entry.get("error") or "")))
    return out


def check_reach(
    plan: Plan,
    hosts: Mapping[str, DeployHost],
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    run_on: HostCommand = on_host,
) -> list[Reach]:
    """Try every route of `routes(plan)` (see the module doc), each probe started on its host
    by `run_on`; [] when there is none."""
    todo = routes(plan)
    if not todo:
        return []
    targets = list(dict.fromkeys(r.target for r in todo))
    sources = list(dict.fromkeys(r.source for r in todo))
    serve_s = LISTEN_START_S + 2 * connect_timeout_s + 10
    listeners = {
        t: _Listener(hosts[t], [r for r in todo if r.target == t], serve_s, run_on) for t in targets
    }
    try:
        states = {t: listener.ready(LISTEN_START_S) for t, listener in listeners.items()}
        results: list[Reach] = []
        runnable: list[Route] = []
        for route in todo:
            state = states[route.target].get((route.bind, route.port))
            if state is None:
                why = listeners[route.target].error
                results.append(Reach(route, "no probe", f"the listener on {route.target}: {why}"))
            elif state not in ("listening", "in use"):
                results.append(Reach(route, "no probe", f"{route.target} {state}"))
            else:
                runnable.append(route)
        with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
            futures = [
                pool.submit(
                    _connect,
                    hosts[source],
                    [r for r in runnable if r.source == source],
                    connect_timeout_s,
                    run_on,
                )
                for source in sources
                if any(r.source == source for r in runnable)
            ]
            for future in futures:
                results += future.result()
    finally:
        for listener in listeners.values():
            listener.stop(wait_s=1.0)
    order = {route: i for i, route in enumerate(todo)}
    return sorted(results, key=lambda r: order[r.route])


def fix(reach: Reach) -> str:
    """What to do about one failed route."""
    route = reach.route
    rule = f"open TCP {route.port} on {route.target} ({route.address}) to {route.source}"
    if reach.state == "timeout":
        return f"packets are dropped on the way (a firewall): {rule}"
    if reach.state == "refused":
        return f"the connection is rejected (a firewall, or a wrong address): {rule}"
    if reach.state == "unreachable":
        return f"{route.source} has no route to {route.address} or a rule prohibits it: {rule}"
    return f"run the probe by hand, or {rule}"


def failure_lines(results: Sequence[Reach]) -> list[str]:
    """Per failed route: the route, what happened, why it matters and what to open."""
    lines = []
    for reach in results:
        if reach.ok:
            continue
        route = reach.route
        lines.append(f"{route.line()}: {reach.state}: {reach.error}")
        lines.append(f"  {WHY.get(route.reached_by, '')}.")
        lines.append(f"  To fix: {fix(reach)}.")
    return lines
