"""The routers under test and the direct path: command lines, start (pinned), readiness, stop.

- `direct`: straight to one non-PD fake worker (the floor: no routing at all);
- `pdkit`: `python -m kit.lb` (this repo), default policies;
- `pdkit_nolog`: the same with `--no-access-log` (what the access log costs);
- `mini_lb`: `python -m sglang_router.launch_router --pd-disaggregation --mini-lb` (0.3.2);
- `smg`: `smg launch --pd-disaggregation` (1.13.0), default policies;
- `pdkit_x1`, `pdkit_x2`: pdkit with one process, and with `--processes 2` (SO_REUSEPORT),
  no access log, both on every CPU (two processes cannot use two cores pinned to one): N
  processes against one on the same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lbbench.cpu import pin
from kit.lb.config import DEFAULT_DECODE_POLICY, DEFAULT_PREFILL_POLICY
from tests.support.fake_worker import FakeWorkerProcess
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
LOG_DIR = REPO / ".bench" / "lb"
START_CPUS = os.sched_getaffinity(0)
"""The CPUs this bench was given (taskset): a router on every CPU gets these."""
NAMES = ("direct", "pdkit", "pdkit_nolog", "mini_lb", "smg", "pdkit_x1", "pdkit_x2")


@dataclass
class Target:
    """One router (or the direct path) and, once started, its process."""

    name: str
    argv: list[str]
    port: int
    ready_path: str
    policies: str
    proc: asyncio.subprocess.Process | None = None
    note: str = ""
    every_cpu: bool = False  # not pinned: a router of several processes


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def targets(names: Sequence[str], fakes: FakeWorkerProcess) -> list[Target]:
    """The routers (and the direct path) to run in front of `fakes`, with their command lines."""
    py_router = os.environ.get(
        "PDKIT_SGLANG_ROUTER_PYTHON", str(REPO / ".venv-sglang-router/bin/python")
    )
    smg = os.environ.get("PDKIT_SMG", str(REPO / ".venv-smg/bin/smg"))
    workers: list[str] = []
    for url, bootstrap_port in fakes.prefills:
        workers += ["--prefill", url, str(bootstrap_port)]
    for url in fakes.decodes:
        workers += ["--decode", url]
    out = []
    for name in names:
        port = free_port()
        common = [*workers, "--host", "127.0.0.1", "--port", str(port)]
        if name == "direct":
            out.append(Target(name, [], _port(fakes.nulls[0]), "", "-"))
        elif name in ("pdkit", "pdkit_nolog"):
            quiet = ["--no-access-log"] if name == "pdkit_nolog" else []
            out.append(
                Target(
                    name,
                    [sys.executable, "-m", "kit.lb", *common, "--log-level", "warning", *quiet],
                    port,
                    "/readiness",
                    f"{DEFAULT_PREFILL_POLICY}/{DEFAULT_DECODE_POLICY}"
                    + (" (no access log)" if quiet else " (access log on)"),
                )
            )
        elif name in ("pdkit_x1", "pdkit_x2"):
            n = name[-1]
            argv = [sys.executable, "-m", "kit.lb", *common, "--log-level", "warning"]
            out.append(
                Target(
                    name,
                    [*argv, "--no-access-log", "--processes", n],
                    port,
                    "/readiness",
                    f"{DEFAULT_PREFILL_POLICY}/{DEFAULT_DECODE_POLICY} ({n} process(es), no log, "
                    "every CPU)",
                    every_cpu=True,
                )
            )
        elif name == "mini_lb":
            out.append(
                Target(
                    name,
                    [
                        py_router,
                        "-m",
                        "sglang_router.launch_router",
                        "--pd-disaggregation",
                        "--mini-lb",
                        *common,
                    ],
                    port,
                    "/health",
                    "random/random (only choice)",
                )
            )
        elif name == "smg":
            out.append(
                Target(
                    name,
                    [
                        smg,
                        "launch",
                        "--pd-disaggregation",
                        *common,
                        "--prometheus-host",
                        "127.0.0.1",
                        "--prometheus-port",
                        str(free_port()),
                        "--log-level",
                        "warn",
                    ],
                    port,
                    "/readiness",
                    "defaults (cache_aware)",
                )
            )
        else:
            raise SystemExit(f"unknown target {name!r}: use {', '.join(NAMES)}")
    return out


async def start(target: Target, router_cpu: int | None, loadgen_cpu: int | None) -> bool:
    """Start a router pinned to `router_cpu` and wait until it is ready; False if it cannot."""
    if not target.argv:
        return True
    if not Path(target.argv[0]).exists():
        target.note = f"skipped: {target.argv[0]} not found (make bench-lb creates it)"
        return False
    log = LOG_DIR / f"{target.name}.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    if target.every_cpu:
        os.sched_setaffinity(0, START_CPUS)
    else:
        pin(router_cpu)  # the child inherits the mask; this process goes back right after
    try:
        with log.open("wb") as sink:
            target.proc = await asyncio.create_subprocess_exec(
                *target.argv,
                cwd=REPO,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )
    finally:
        pin(loadgen_cpu)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if target.proc.returncode is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            target.note = f"failed to start ({log}): {tail[0]}"
            return False
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
            writer.write(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                % target.ready_path.encode()
            )
            head = await reader.readuntil(b"\r\n")
            writer.close()
            if int(head[9:12]) == 200:
                return True
        await asyncio.sleep(0.2)
    target.note = "not ready within 60 s"
    return False


async def stop(target: Target) -> None:
    proc = target.proc
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
