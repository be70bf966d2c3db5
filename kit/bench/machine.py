"""Is the client or this machine the bottleneck, rather than the deployment under test?

While a rate point runs, `LoadMonitor` samples this process's CPU time, the whole machine's
CPU use (/proc/stat) and the event loop's lag (how late a 10 ms timer fires). A client that
uses most of a core, or whose loop lags, sends late and reads late: its latencies then include
its own queueing. A machine whose cores are all busy (the emulated workers, the router and the
client sharing a laptop) slows everything on it. `verdict` turns the samples, and how late
requests went out, into plain findings.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

CLIENT_CPU_LIMIT = 0.85
"""Share of one core above which the client itself is the bottleneck."""
HOST_CPU_LIMIT = 0.90
"""Share of all cores above which the machine is saturated (over the whole point)."""
SATURATED_INTERVAL = 0.95
"""Busy share of all cores that makes a 100 ms interval saturated."""
SATURATED_LIMIT = 0.25
"""Share of saturated intervals above which the machine set the pace of the point."""
SAMPLE_S = 0.1
LOOP_LAG_LIMIT_MS = 20.0
SEND_LAG_LIMIT_MS = 10.0
TICK_S = 0.01


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROCESS_CPU_LIMIT = 0.9
"""Share of one core above which a process of the deployment on this machine is saturated."""


def _process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), seconds; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _host_cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, None where /proc/stat is absent."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@dataclass
class MachineLoad:
    """What one rate point cost: client CPU (share of one core), host CPU (share of all
    cores, None when unknown), the event loop's lag (ms) and the cores of this machine."""

    client_cpu: float = 0.0
    host_cpu: float | None = None
    loop_lag_p99_ms: float = 0.0
    loop_lag_max_ms: float = 0.0
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    processes: dict[str, float] = field(default_factory=dict)
    """The deployment's processes on this machine: share of one core each used."""
    saturated: float = 0.0
    """Share of the point's 100 ms intervals in which every core of this machine was busy."""

    def to_json(self) -> dict[str, object]:
        return {
            "processes": {name: round(share, 3) for name, share in self.processes.items()},
            "saturated": round(self.saturated, 3),
            "client_cpu": round(self.client_cpu, 3),
            "host_cpu": None if self.host_cpu is None else round(self.host_cpu, 3),
            "loop_lag_p99_ms": round(self.loop_lag_p99_ms, 2),
            "loop_lag_max_ms": round(self.loop_lag_max_ms, 2),
            "cores": self.cores,
        }


class LoadMonitor:
    """`async with LoadMonitor(watch) as monitor:` around a point; `monitor.load` after.
    `watch` names the deployment's processes on this machine (name -> pid)."""

    def __init__(self, watch: dict[str, int] | None = None) -> None:
        self.load = MachineLoad()
        self._watch = dict(watch or {})
        self._busy: list[float] = []
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadMonitor:
        self._wall = time.monotonic()
        self._cpu = time.process_time()
        self._host = _host_cpu_ticks()
        self._processes = {name: _process_cpu_s(pid) for name, pid in self._watch.items()}
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        wall = max(time.monotonic() - self._wall, 1e-9)
        self.load.client_cpu = (time.process_time() - self._cpu) / wall
        for name, pid in self._watch.items():
            before, after = self._processes.get(name), _process_cpu_s(pid)
            if before is not None and after is not None:
                self.load.processes[name] = (after - before) / wall
        host = _host_cpu_ticks()
        if host is not None and self._host is not None and host[1] > self._host[1]:
            self.load.host_cpu = (host[0] - self._host[0]) / (host[1] - self._host[1])
        if self._busy:
            hot = sum(1 for b in self._busy if b >= SATURATED_INTERVAL)
            self.load.saturated = hot / len(self._busy)
        if self._lags:
            ordered = sorted(self._lags)
            self.load.loop_lag_p99_ms = ordered[int(0.99 * (len(ordered) - 1))]
            self.load.loop_lag_max_ms = ordered[-1]

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        sample_at = loop.time() + SAMPLE_S
        last = _host_cpu_ticks()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            now = loop.time()
            self._lags.append(max(0.0, (now - before - TICK_S) * 1000))
            if now >= sample_at:
                sample_at = now + SAMPLE_S
                ticks = _host_cpu_ticks()
                if ticks is not None and last is not None and ticks[1] > last[1]:
                    self._busy.append((ticks[0] - last[0]) / (ticks[1] - last[1]))
                last = ticks


Bottleneck = Literal["client", "host"]


def verdict(load: MachineLoad, send_lag_p90_ms: float) -> list[tuple[Bottleneck, str]]:
    """What besides the deployment set a point's pace, with a note for the user (empty: the
    client and the machine kept up). `send_lag_p90_ms`: how late requests went out against
    their arrival times."""
    notes: list[tuple[Bottleneck, str]] = []
    if load.client_cpu >= CLIENT_CPU_LIMIT:
        notes.append(
            (
                "client",
                f"client-bound: pdkit bench used {load.client_cpu:.0%} of a core; latencies "
                "include its own queueing (lower the rate, or run the client on another machine)",
            )
        )
    if load.loop_lag_p99_ms >= LOOP_LAG_LIMIT_MS:
        notes.append(
            (
                "client",
                f"client-bound: its event loop ran {load.loop_lag_p99_ms:.0f} ms late (p99); "
                "token times are that coarse",
            )
        )
    if send_lag_p90_ms >= SEND_LAG_LIMIT_MS:
        notes.append(
            ("client", f"client-bound: requests went out {send_lag_p90_ms:.0f} ms late (p90)")
        )
    busy = {n: share for n, share in load.processes.items() if share >= PROCESS_CPU_LIMIT}
    if busy:
        names = ", ".join(f"{n} {share:.0%}" for n, share in sorted(busy.items()))
        notes.append(
            (
                "host",
                f"host-bound: the deployment's processes on this machine used a whole core "
                f"({names} of one core): they, not the emulated GPUs, set the pace here",
            )
        )
    if load.saturated >= SATURATED_LIMIT or (
        load.host_cpu is not None and load.host_cpu >= HOST_CPU_LIMIT
    ):
        notes.append(
            (
                "host",
                f"host-bound: this machine's {load.cores} cores were all busy for "
                f"{load.saturated:.0%} of the point ({load.host_cpu or 0:.0%} on average); when "
                "the deployment runs here too (engine sim), it and the client compete for them",
            )
        )
    return notes
