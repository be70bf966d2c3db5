"""`pdkit provision --transfer-test`: the Mooncake transfer engine itself, between every ordered
pair of worker hosts, on every rail, with the bandwidth it reached against the link rate.

A rail is one RDMA device the host's workers use (protocol rdma, the NIC named), or, where KV
moves over TCP (mooncake_tcp, engine sim), the host's address (protocol tcp). Rail i of a host
writes to rail i of its peer (modulo the peer's rail count). Each host runs `kvprobe.py` (a host
script of the playbooks, `roles/pdkit_check/files/`) with the deployment's Python (the
provisioned venv), sent on stdin over SSH like `pdkit logs` reaches hosts; a target serves its
buffer, an initiator writes into it and times the writes.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.inventory import DeployHost
from kit.hosts.logs import ssh_argv
from kit.hosts.playbook import host_script, start_host_script
from kit.topology.nics import RDMA_BACKENDS

PROBE = "kvprobe.py"
PROBE_ROLE = "pdkit_check"
"""The role whose files/ hold the probes pdkit sends to the hosts (beside its host_check.py)."""
SIZE_BYTES = 32 * 1024**2
ROUNDS = 4
START_TIMEOUT_S = 60.0
WRITE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Rail:
    host: str
    address: str
    protocol: str  # "rdma" or "tcp"
    device: str  # the NIC, or "" for tcp

    @property
    def name(self) -> str:
        return self.device or "tcp"


@dataclass(frozen=True)
class RailResult:
    source: Rail
    target: Rail
    bytes: int
    seconds: float
    error: str = ""
    link_gb_s: float | None = None

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def gb_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def line(self) -> str:
        what = f"{self.source.host} {self.source.name} -> {self.target.host} {self.target.name}"
        if not self.ok:
            return f"{what}: FAILED: {self.error}"
        link = ""
        if self.link_gb_s:
            link = f" ({self.gb_s / self.link_gb_s:.0%} of the {self.link_gb_s:g} GB/s link)"
        return f"{what}: {self.gb_s:.2f} GB/s{link}"


def rails(ctx: DeployContext) -> dict[str, list[Rail]]:
    """Each worker host's rails (see the module doc), hosts in Plan order."""
    plan = ctx.plan
    rdma = plan.transfer_backend in RDMA_BACKENDS and plan.engine == "sglang"
    out: dict[str, list[Rail]] = {}
    for worker in plan.workers:
        host = plan.host(worker.host)
        devices = sorted({d for w in plan.on_host(host.name) for d in w.rdma_devices})
        if rdma and devices:
            out[host.name] = [Rail(host.name, host.address, "rdma", d) for d in devices]
        else:
            out[host.name] = [Rail(host.name, host.address, "tcp", "")]
    return out


def pairs(by_host: Mapping[str, Sequence[Rail]]) -> list[tuple[Rail, Rail]]:
    """(source, target) for every ordered pair of hosts and every rail of the target."""
    out = []
    for a, sources in by_host.items():
        for b, targets in by_host.items():
            if a == b:
                continue
            for i, target in enumerate(targets):
                out.append((sources[i % len(sources)], target))
    return out


def link_rate_gb_s(rate: str) -> float | None:
    """sysfs's "400 Gb/sec (4X NDR)" -> 50.0 GB/s; None when unreadable."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", rate)
    return float(match.group(1)) / 8 if match else None


def link_rates(facts: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """(host, device) -> link rate in GB/s, from provisioning's RDMA facts."""
    out = {}
    for host, found in facts.items():
        for device in (found.get("pdkit_rdma_facts") or {}).get("devices", []):
            for port in device.get("ports", []):
                rate = link_rate_gb_s(str(port.get("rate", "")))
                if rate and port.get("active"):
                    out[host, str(device["name"])] = rate
    return out


def host_argv(host: DeployHost, args: list[str]) -> list[str]:
    """argv that runs a script sent on stdin with the host's Python (over SSH if remote)."""
    command = [host.python, "-", *args]
    return command if host.local else ssh_argv(host, command)


@dataclass(frozen=True)
class ProbeRun:
    """One probe script's run on a host: its exit status, stderr and last JSON line."""

    returncode: int
    stderr: str
    result: dict[str, Any] | None  # None: it printed no JSON line

    @property
    def error(self) -> str:
        return last_error(self.stderr) or f"exit status {self.returncode}"


def run_probe(host: DeployHost, script: str, args: list[str], timeout_s: float) -> ProbeRun | None:
    """Run the probe `script` of `PROBE_ROLE`'s files (sent on stdin) with the host's Python;
    None when it does not end within `timeout_s`."""
    try:
        done = subprocess.run(
            host_argv(host, args),
            input=host_script(PROBE_ROLE, script),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return ProbeRun(done.returncode, done.stderr, json.loads(lines[-1]) if lines else None)


def _common(rail: Rail) -> list[str]:
    args = ["--host", rail.address, "--protocol", rail.protocol, "--size", str(SIZE_BYTES)]
    return [*args, "--device", rail.device] if rail.device else args


class _Target:
    """A target probe on its host: its session and buffer once it printed them."""

    def __init__(self, host: DeployHost, rail: Rail, serve_s: float) -> None:
        self.rail = rail
        argv = host_argv(host, ["target", *_common(rail), "--serve-s", str(serve_s)])
        self.proc = start_host_script(argv, PROBE_ROLE, PROBE)
        self.session = ""
        self.addr = 0

    def ready(self, timeout: float) -> str:
        """Wait for the session line; '' when ready, else why not."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if readable:
                line = self.proc.stdout.readline()
                if not line:
                    break
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                self.session, self.addr = str(data["session"]), int(data["addr"])
                return ""
            if self.proc.poll() is not None:
                break
        self.stop()
        return last_error(self.proc.stderr.read() if self.proc.stderr else "") or "no answer"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line[:1] == "E" or "rror" in line or "failed" in line]
    return (errors or lines or [""])[-1][:300]


def _write(host: DeployHost, source: Rail, target: _Target) -> tuple[int, float, str]:
    args = ["initiator", *_common(source), "--rounds", str(ROUNDS)]
    args += ["--session", target.session, "--remote-addr", str(target.addr)]
    run = run_probe(host, PROBE, args, WRITE_TIMEOUT_S)
    if run is None:
        return 0, 0.0, f"no answer within {WRITE_TIMEOUT_S:g} s"
    result = run.result
    if run.returncode != 0 or result is None:
        rc = f"Mooncake returned {result['rc']}: " if result and "rc" in result else ""
        return 0, 0.0, rc + run.error
    return int(result["bytes"]), float(result["seconds"]), ""


def measure_rails(ctx: DeployContext, facts: Mapping[str, Mapping[str, Any]]) -> list[RailResult]:
    """Every ordered host pair on every rail (see the module doc), one write at a time; `facts`
    are the provisioning facts per host (for each NIC's link rate)."""
    by_host = rails(ctx)
    if len(by_host) < 2:
        return []
    todo = pairs(by_host)
    rates = link_rates(facts)
    serve_s = START_TIMEOUT_S + len(todo) * WRITE_TIMEOUT_S
    targets = {
        (rail.host, rail.name): _Target(ctx.host(rail.host), rail, serve_s)
        for host_rails in by_host.values()
        for rail in host_rails
    }
    try:
        broken = {key: t.ready(START_TIMEOUT_S) for key, t in targets.items()}
        results = []
        for source, target_rail in todo:
            target = targets[target_rail.host, target_rail.name]
            link = rates.get((target_rail.host, target_rail.device))
            why = broken[target_rail.host, target_rail.name]
            if why:
                results.append(RailResult(source, target_rail, 0, 0.0, f"target: {why}", link))
                continue
            moved, seconds, error = _write(ctx.host(source.host), source, target)
            results.append(RailResult(source, target_rail, moved, seconds, error, link))
        return results
    finally:
        for target in targets.values():
            target.stop()


def raise_on_failed(results: Sequence[RailResult]) -> None:
    """Raise `DeployError` naming the pairs and rails that moved nothing."""
    failed = [r for r in results if not r.ok]
    if failed:
        raise DeployError(
            "The transfer test failed between "
            + ", ".join(
                f"{r.source.host} {r.source.name} -> {r.target.host} {r.target.name}"
                for r in failed
            )
            + ":\n"
            + "\n".join(f"  {r.line()}" for r in failed)
            + "\nTo fix: open TCP 15000-17000 (Mooncake's RPC range) between the hosts, check "
            "the NIC map and transfer.gid_index (`pdkit discover T`), and the locked-memory limit."
        )
