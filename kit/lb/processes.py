"""Several router processes on one port (--processes N): one core each, SO_REUSEPORT.

1. `supervise`: the process started (by systemd or supervisord, as for one router) binds N
   sockets to the port with SO_REUSEPORT (`kit.lb.listen`), forks N serving processes, one
   socket each, and only watches them: it passes on SIGTERM, SIGINT and SIGHUP, starts again
   one that dies on its own, and exits when all have stopped (with the status of one that
   could not start). Children get SIGTERM if it dies (PDEATHSIG).
   The handover (SIGUSR2, as for one router, but without a pause in accepting):
   a. the supervisor execs the launch script again (same PID) with the sockets and its
      children's pids passed on; the old children keep serving meanwhile;
   b. the new image forks its group on the same sockets (the old children are still its
      children) and waits until every new child has written its slot (it serves);
   c. then it sends the old children SIGUSR2: each stops accepting and finishes its
      in-flight requests (closing each connection after its response) and exits. The
      sockets stay open in the supervisor throughout, so no queued connection is reset.
   A new image that cannot start its group stops the old one too (as one router's does).
2. Each child serves the same port (the kernel spreads connections over them) with its own
   upstream pools, health probes and KV-event subscriptions, and a configuration in which the
   limits that count requests at once are its share (`process_config`): --prefill-max-inflight
   per prefill and --hold-max, split so that the N shares add up to the limit; the client
   limits' token buckets (--client-limits) are shared (`kit.lb.limits.SharedBuckets`), so a
   client gets its rate whichever process it reaches. Admission's view of the load comes
   from what the workers report (`kit.lb.loads`), which counts every process's requests.
3. `ProcessGroup` (in each child): its slot in a table shared by all (pid, requests in flight,
   held, queued, served), which /readiness shows for every process; and one scrape of
   /metrics on any process answers for all, each sample labelled `process` (the siblings are
   asked over Unix sockets in a private folder; `/metrics?local=1` is one process's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import signal
import socket
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from kit.lb.config import LbConfig
from kit.lb.limits import ClientLimits, SharedBuckets
from kit.lb.listen import assign, listeners, relaunch

if TYPE_CHECKING:
    from kit.lb.server import LoadBalancer

log = logging.getLogger("kit.lb")

SLOT = struct.Struct("<qdqqqq")  # pid, started (unix s), inflight, held, queued, served
HEARTBEAT_S = 0.5
"""Seconds between two writes of a process's slot."""
SIBLING_TIMEOUT_S = 2.0
"""Longest wait for a sibling's /metrics in an aggregated scrape."""
FAILED_START_S = 5.0
"""A child that exits on its own within this many seconds of its start could not start: the
whole group stops with its status instead of starting it again and again."""
PR_SET_PDEATHSIG = 1
WAIT_S = 0.05
"""Seconds between two looks of the supervisor at its children."""
OLD_GROUP_ENV = "PDKIT_LB_OLD_GROUP"
"""Set by a group's handover for the new image: the old children's pids and private folder."""


def share(total: int, n: int, index: int) -> int:
    """Process `index`'s share of `total` over `n` processes: the shares add up to `total`."""
    return total // n + (1 if index < total % n else 0)


def process_config(config: LbConfig, index: int) -> LbConfig:
    """Process `index`'s configuration: its share of the limits that count requests at once
    (0 stays 0: no limit), and its own seed (bootstrap rooms must not repeat across processes)."""
    n = config.processes
    limit = config.prefill_max_inflight
    return replace(
        config,
        prefill_max_inflight=share(limit, n, index) if limit else 0,
        hold_max=share(config.hold_max, n, index),
        seed=None if config.seed is None else config.seed + index,
    )


@dataclass(frozen=True, slots=True)
class ProcessState:
    """One process's slot as last written (`age_s`: seconds since)."""

    index: int
    pid: int
    started: float
    inflight: int
    held: int
    queued: int
    served: int

    def to_json(self) -> dict[str, object]:
        return {
            "process": self.index,
            "pid": self.pid,
            "up_s": round(max(time.time() - self.started, 0.0), 1) if self.pid else 0.0,
            "inflight": self.inflight,
            "held": self.held,
            "queued": self.queued,
            "served": self.served,
            "running": bool(self.pid) and pid_running(self.pid),
        }


def pid_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie: a process whose parent died is reparented to
    PID 1, and not every PID 1 reaps it soon, so signal 0 alone keeps answering for it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc: signal 0's answer
    # The state follows the command name, which is in parentheses and may hold spaces.
    return fields.rpartition(")")[2].split()[:1] != ["Z"]


class ProcessTable:
    """The slots of N processes in memory shared across fork (anonymous, MAP_SHARED)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._mm = mmap.mmap(-1, SLOT.size * n)

    def write(self, index: int, *values: float) -> None:
        SLOT.pack_into(self._mm, index * SLOT.size, *values)

    def read(self) -> list[ProcessState]:
        out = []
        for i in range(self.n):
            pid, started, inflight, held, queued, served = SLOT.unpack_from(self._mm, i * SLOT.size)
            out.append(ProcessState(i, pid, started, inflight, held, queued, served))
        return out


class ProcessGroup:
    """This process's place among its siblings (built in the supervisor, used in a child)."""

    def __init__(
        self,
        n: int,
        folder: Path,
        table: ProcessTable,
        index: int = 0,
        buckets: SharedBuckets | None = None,
    ) -> None:
        self.n = n
        self.folder = folder
        self.table = table
        self.index = index
        self.buckets = buckets  # the client limits' token buckets, shared by all
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._served = 0

    def socket_path(self, index: int) -> str:
        return str(self.folder / f"process-{index}.sock")

    async def start(self, runner: web.BaseRunner, lb: LoadBalancer) -> None:
        """Listen on this process's Unix socket too, and keep its slot up to date."""
        site = web.UnixSite(runner, self.socket_path(self.index))
        await site.start()
        started = time.time()

        async def beat() -> None:
            while True:
                served = sum(lb.metrics.requests.values())
                queued = lb.metrics.queued
                self.table.write(
                    self.index, os.getpid(), started, lb.inflight, lb.metrics.held, queued, served
                )
                await asyncio.sleep(HEARTBEAT_S)

        self._heartbeat = asyncio.create_task(beat())

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        for session in self._sessions.values():
            await session.close()

    def states(self) -> list[dict[str, object]]:
        """Every process's slot, for /readiness and `pdkit status`."""
        return [s.to_json() for s in self.table.read()]

    async def _sibling_metrics(self, index: int) -> str | None:
        session = self._sessions.get(index)
        if session is None:
            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path(index)),
                timeout=aiohttp.ClientTimeout(total=SIBLING_TIMEOUT_S),
            )
            self._sessions[index] = session
        try:
            async with session.get("http://process/metrics?local=1") as response:
                if response.status != 200:
                    return None
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def metrics(self, own: bytes) -> bytes:
        """The whole router's /metrics: this process's `own` text and each sibling's, every
        sample labelled `process`; `pdkit_lb_process_up` says which answered."""
        others = [i for i in range(self.n) if i != self.index]
        answers = await asyncio.gather(*(self._sibling_metrics(i) for i in others))
        texts = {self.index: own.decode(), **dict(zip(others, answers, strict=True))}
        return merge_metrics(texts)


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_metrics(texts: dict[int, str | None]) -> bytes:
    """One exposition text from each process's (None: it did not answer), every sample with a
    `process` label, each family once."""
    families: dict[str, Metric] = {}
    up = Metric("pdkit_lb_process_up", "Router processes that answered this scrape", "gauge")
    for index, text in sorted(texts.items()):
        up.add_sample("pdkit_lb_process_up", {"process": str(index)}, float(text is not None))
        for family in text_string_to_metric_families(text or ""):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                labels = {"process": str(index), **sample.labels}
                merged.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([*families.values(), up]))
    return generate_latest(registry)


# -- the supervisor ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the supervisor dies (no orphaned listeners)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def handed_over_group() -> bool:
    """Whether this image takes over from a group of processes (a supervisor execed on
    SIGUSR2): it supervises whatever --processes says, the old group's end included."""
    return bool(os.environ.get(OLD_GROUP_ENV))


def _old_group() -> tuple[set[int], str | None]:
    """The old group's pids and its private folder, passed on by a handover (then unset)."""
    pids, _, folder = os.environ.pop(OLD_GROUP_ENV, "").partition(";")
    return {int(p) for p in pids.split(",") if p.isdigit()}, folder or None


def supervise(
    config: LbConfig,
    serve_child: Callable[[LbConfig, ProcessGroup, list[socket.socket]], int],
) -> int:
    """Fork `config.processes` children that each run `serve_child(its config, its group, its
    sockets)`; pass signals on, start again a child that dies, return when all have stopped.
    On SIGUSR2, hand over (the module doc): exec the new image with the sockets and the
    children passed on. `LbError` when the port cannot be listened on."""
    n = config.processes
    socks = listeners(config, n)
    folder = Path(tempfile.mkdtemp(prefix="pdkit-lb-"))
    table = ProcessTable(n)
    slots = ClientLimits.slots(config.client_limits)
    buckets = SharedBuckets(slots) if slots else None
    children: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
    old, old_folder = _old_group()  # the group this image took over from, still serving
    finishing: set[int] = set()  # old processes told to finish (SIGUSR2)
    stopping = False
    handing_over = False
    status = 0

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping, handing_over
        if signum == signal.SIGUSR2:
            handing_over = True
            return
        if signum in (signal.SIGTERM, signal.SIGINT):
            stopping = True
        for pid in [*children, *old, *finishing]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def spawn(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                for sig in (signal.SIGHUP, signal.SIGUSR2):
                    signal.signal(sig, signal.SIG_IGN)  # the loop handles them once up
                _die_with_parent()
                group = ProcessGroup(n, folder, table, index, buckets)
                code = serve_child(process_config(config, index), group, assign(socks, n, index))
            finally:
                os._exit(code)
        children[pid] = (index, time.monotonic())

    def listening() -> bool:
        """Every child has written its slot: it serves its sockets."""
        pids = {s.pid for s in table.read()}
        return all(pid in pids for pid in children)

    def reap() -> None:
        nonlocal stopping, status
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            old.discard(pid)
            finishing.discard(pid)
            if pid not in children:
                continue
            index, started = children.pop(pid)
            code = os.waitstatus_to_exitcode(wait_status)
            if stopping:
                continue
            if time.monotonic() - started < FAILED_START_S and code != 0:
                log.error("router process %d could not start (status %d): stopping", index, code)
                status = code if code > 0 else 1
                stopping = True
                forward(signal.SIGTERM, None)
                continue
            log.warning(
                "router process %d (pid %d) exited with %d: starting it again", index, pid, code
            )
            spawn(index)

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        for index in range(n):
            spawn(index)
        while children or old or finishing:
            reap()
            if old and not stopping and listening():
                log.info("new group listening: the old one (%s) finishes", sorted(old))
                for pid in old:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR2)
                finishing |= old
                old.clear()
                if old_folder:
                    shutil.rmtree(old_folder, ignore_errors=True)
            if handing_over and not stopping:
                pids = ",".join(str(p) for p in [*children, *old, *finishing])
                relaunch(socks, {OLD_GROUP_ENV: f"{pids};{folder}"})
            time.sleep(WAIT_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(folder, ignore_errors=True)
    return status
