"""The leader's and the followers' loops of a rank group (one multi-node instance).

Why an agent per rank rather than the service manager alone: the ranks run on different hosts,
each under its own systemd or supervisord, and neither sees the other hosts. A rank restarted
alone cannot rejoin a torch group that runs without it (SGLang's ranks fail together: a lost
peer kills rank 0's scheduler, a lost rank 0 ends its followers), and a follower started before
its rank 0 waits on a rendezvous that may never come. So the agents decide together:

1. The agent beside node rank 0 (the leader) listens on the instance's group port; the agent of
   every other rank (a follower) connects to it and says its rank. Both ends send a ping line
   every `PING_S`; a peer silent for `SILENT_S` is gone (a host that vanished sends no reset).
2. Once every follower is connected, the leader starts generation G: its own rank first (it
   holds torch's rendezvous, SGLang's order), then tells the followers ``{"start": G}``; each
   starts its rank, which joins rank 0 (SGLang's followers retry the rendezvous).
3. Generation G ends on the first of: rank 0's process exits, a follower reports its rank's
   exit ``{"exited": G}``, a follower's agent is lost or joins again, or the leader is stopped.
   The log names what ended it; after rank 0's exit the leader waits `PEER_REPORT_S` for a
   follower's report, since a peer's death takes SGLang's rank 0 along.
4. The leader stops its own rank (SIGTERM: SGLang's rank 0 tells its followers to exit), then
   tells the followers ``{"stop": G}`` (each stops its rank: SIGTERM, SIGKILL after
   `FOLLOWER_TERM_S`, as SGLang's followers ignore SIGTERM) and waits for ``{"stopped": G}``.
5. After the restart delay (doubling while generations die young, up to `MAX_DELAY_S`) it goes
   back to 2. Meanwhile the router has ejected the instance (its health fails) and holds or
   reroutes its requests; it readmits it when node rank 0 answers healthy again.

A follower whose leader is lost stops its rank (it cannot go on without rank 0) and reconnects.
Each rank runs in a session of its own, killed as a whole, and dies with its agent
(PR_SET_PDEATHSIG), so that no rank outlives the agent that answers for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kit.net import split_host_port

logger = logging.getLogger("kit.ranks")

PING_S = 1.0
SILENT_S = 5.0
"""Seconds without a line after which the other end is taken as gone."""
FOLLOWER_TERM_S = 5.0
"""Seconds a follower's rank gets after SIGTERM before SIGKILL (SGLang's ignore SIGTERM)."""
PEER_REPORT_S = 2.0
"""Seconds the leader waits, once rank 0's process exited, for a follower's report of its own
rank's exit (the rank that died first, when a peer's death took rank 0 along)."""
LONG_LIVED_S = 60.0
"""A generation that lived this long resets the restart delay to its first value."""
MAX_DELAY_S = 60.0
WAIT_LOG_S = 10.0
MAX_LINE = 4096

_PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
"""Linux's prctl (None elsewhere: a rank then outlives a SIGKILLed agent)."""


@dataclass(frozen=True)
class GroupSettings:
    """One rank's view of its group (``python -m kit.ranks`` flags)."""

    leader: str
    """host:port of node rank 0's agent."""
    node_rank: int
    nnodes: int
    restart_delay_s: float
    stop_timeout_s: float
    """Seconds rank 0 gets after SIGTERM before SIGKILL."""


def _die_with_agent() -> None:
    """In the rank's process, before exec: SIGKILL when the agent dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Rank:
    """The rank's process (SGLang's or the sim's), in a session of its own."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> asyncio.subprocess.Process:
        """Start it (stdout and stderr: the agent's, so its log)."""
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_agent,  # prctl only, no threads involved
        )
        return self.process

    async def stop(self, grace_s: float) -> None:
        """SIGTERM its whole session, SIGKILL after `grace_s` seconds; then what is left."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.returncode is None:
            _signal_session(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace_s)
            except TimeoutError:
                logger.warning("pid %d outlived SIGTERM by %.0f s: SIGKILL", process.pid, grace_s)
        _signal_session(process.pid, signal.SIGKILL)
        await process.wait()


def _signal_session(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _send(writer: asyncio.StreamWriter, message: dict[str, object]) -> None:
    if not writer.is_closing():
        writer.write(json.dumps(message).encode() + b"\n")


async def _receive(reader: asyncio.StreamReader) -> dict[str, object] | None:
    """The next line other than a ping; None when the peer closed, broke or went silent."""
    while True:
        try:
            line = await asyncio.wait_for(reader.readline(), SILENT_S)
        except (TimeoutError, OSError, ValueError):
            return None
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if isinstance(message, dict) and "ping" not in message:
            return message
        if not isinstance(message, dict):
            return None


async def _ping(writers: Callable[[], Sequence[asyncio.StreamWriter]]) -> None:
    while True:
        for writer in writers():
            with contextlib.suppress(OSError):
                _send(writer, {"ping": 1})
        await asyncio.sleep(PING_S)


async def _until(
    condition: Callable[[], bool],
    changed: asyncio.Event,
    stopping: asyncio.Event,
    timeout: float | None = None,
) -> bool:
    """Whether `condition` held before `stopping` or `timeout` seconds; checked whenever
    `changed` is set."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        changed.clear()
        if condition():
            return True
        left = None if deadline is None else deadline - loop.time()
        if stopping.is_set() or (left is not None and left <= 0):
            return False
        waits = {asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stopping.wait())}
        _, pending = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()


class Leader:
    """Node rank 0's agent: starts and restarts the whole group."""

    def __init__(self, settings: GroupSettings, command: Sequence[str]) -> None:
        self.settings = settings
        self.rank = Rank(command)
        self.followers: dict[int, asyncio.StreamWriter] = {}
        self.changed = asyncio.Event()
        self.generation = 0
        self.running = False
        self.failure: str | None = None
        self.stopped: set[int] = set()

    def _fail(self, what: str) -> None:
        if self.running and self.failure is None:
            self.failure = what
        self.changed.set()

    def _broadcast(self, message: dict[str, object]) -> None:
        for writer in self.followers.values():
            _send(writer, message)

    async def serve(self, stopping: asyncio.Event) -> None:
        """Lead the group until `stopping` is set; every rank is stopped on return."""
        settings = self.settings
        host, port = split_host_port(settings.leader)
        server = await asyncio.start_server(
            self._follower, host, port, reuse_address=True, limit=MAX_LINE
        )
        pinger = asyncio.ensure_future(_ping(lambda: list(self.followers.values())))
        delay = settings.restart_delay_s
        loop = asyncio.get_running_loop()
        try:
            while await self._all_joined(stopping):
                started = loop.time()
                await self._generation(stopping)
                if stopping.is_set():
                    break
                delay = settings.restart_delay_s if loop.time() - started > LONG_LIVED_S else delay
                logger.info("starting every rank again in %.1f s", delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                delay = min(delay * 2, MAX_DELAY_S)
        finally:
            pinger.cancel()
            server.close()
            await self.rank.stop(settings.stop_timeout_s)
            for writer in self.followers.values():
                writer.close()

    async def _all_joined(self, stopping: asyncio.Event) -> bool:
        """Until every follower's agent is connected (False: stopping)."""
        wanted = set(range(1, self.settings.nnodes))
        while not await _until(
            lambda: set(self.followers) == wanted, self.changed, stopping, WAIT_LOG_S
        ):
            if stopping.is_set():
                return False
            missing = ", ".join(str(r) for r in sorted(wanted - set(self.followers)))
            logger.info(
                "waiting for node rank(s) %s: their agents connect to %s",
                missing,
                self.settings.leader,
            )
        return True

    async def _generation(self, stopping: asyncio.Event) -> None:
        """Start every rank, rank 0 first; stop them all when one fails (or on `stopping`)."""
        self.generation += 1
        generation = self.generation
        self.failure, self.stopped = None, set()
        process = await self.rank.start()
        self.running = True
        logger.info(
            "generation %d: node rank 0 started (pid %d); starting node ranks 1-%d",
            generation,
            process.pid,
            self.settings.nnodes - 1,
        )
        self._broadcast({"start": generation})
        exited = asyncio.ensure_future(process.wait())
        exited.add_done_callback(lambda _: self.changed.set())
        await _until(lambda: exited.done() or self.failure is not None, self.changed, stopping)
        if exited.done() and self.failure is None:
            # SGLang kills rank 0's process tree once a peer's link breaks, which can reach this
            # agent before the report of the follower whose rank died first: wait a moment for
            # such a report, so that the log names that rank.
            await _until(lambda: self.failure is not None, self.changed, stopping, PEER_REPORT_S)
        self.running = False
        if stopping.is_set():
            reason = "the agent was told to stop"
        else:
            ends = [] if self.failure is None else [self.failure]
            if exited.done():
                ends.append(f"node rank 0's process exited with {exited.result()}")
            reason = "; ".join(ends)
        logger.warning("generation %d ends: %s; stopping every rank", generation, reason)
        await self.rank.stop(self.settings.stop_timeout_s)
        self._broadcast({"stop": generation})
        everyone_stopped = await _until(
            lambda: set(self.followers) <= self.stopped,
            self.changed,
            asyncio.Event(),
            FOLLOWER_TERM_S + SILENT_S,
        )
        if not everyone_stopped:
            logger.warning("a node rank did not confirm its stop; going on")

    async def _follower(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await _receive(reader)
        rank = hello.get("node_rank") if hello else None
        if not isinstance(rank, int) or not 1 <= rank < self.settings.nnodes:
            logger.warning("refused a connection that named no node rank 1-%d: %s", rank, hello)
            writer.close()
            return
        old = self.followers.get(rank)
        if old is not None:
            old.close()
        self.followers[rank] = writer
        logger.info("node rank %d joined from %s", rank, writer.get_extra_info("peername"))
        self._fail(f"node rank {rank}'s agent joined again while generation {self.generation} ran")
        try:
            while (message := await _receive(reader)) is not None:
                if message.get("exited") == self.generation:
                    self._fail(f"node rank {rank}'s process exited with {message.get('code')}")
                if message.get("stopped") == self.generation:
                    self.stopped.add(rank)
                self.changed.set()
        finally:
            if self.followers.get(rank) is writer:
                del self.followers[rank]
                logger.warning("node rank %d's agent is gone", rank)
                self._fail(f"node rank {rank}'s agent is gone (closed, or silent {SILENT_S:.0f} s)")
            writer.close()
            self.changed.set()


class Follower:
    """The agent of a node rank above 0: starts and stops its rank as the leader says."""

    def __init__(self, settings: GroupSettings, command: Sequence[str]) -> None:
        self.settings = settings
        self.rank = Rank(command)

    async def serve(self, stopping: asyncio.Event) -> None:
        """Follow the leader until `stopping` is set; the rank is stopped on return."""
        host, port = split_host_port(self.settings.leader)
        loop = asyncio.get_running_loop()
        logged = -WAIT_LOG_S
        try:
            while not stopping.is_set():
                try:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(host, port, limit=MAX_LINE), SILENT_S
                    )
                except (OSError, TimeoutError) as exc:
                    if loop.time() - logged >= WAIT_LOG_S:
                        logged = loop.time()
                        logger.info(
                            "node rank %d waits for node rank 0's agent at %s (%s)",
                            self.settings.node_rank,
                            self.settings.leader,
                            exc or "timed out",
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), PING_S)
                    continue
                await self._session(reader, writer, stopping)
                # Without its rank 0 this rank cannot go on: stop it, wait for a new generation.
                await self.rank.stop(FOLLOWER_TERM_S)
        finally:
            await self.rank.stop(FOLLOWER_TERM_S)

    async def _session(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stopping: asyncio.Event
    ) -> None:
        _send(writer, {"node_rank": self.settings.node_rank})
        logger.info(
            "node rank %d joined its group at %s", self.settings.node_rank, self.settings.leader
        )
        stop = asyncio.ensure_future(stopping.wait())
        tasks: set[asyncio.Future[Any]] = {stop, asyncio.ensure_future(_ping(lambda: [writer]))}
        try:
            while True:
                receiving = asyncio.ensure_future(_receive(reader))
                await asyncio.wait({receiving, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop.done():
                    receiving.cancel()
                    return
                message = receiving.result()
                if message is None:
                    logger.warning("lost node rank 0's agent at %s", self.settings.leader)
                    return
                if isinstance(generation := message.get("start"), int):
                    await self.rank.stop(FOLLOWER_TERM_S)
                    process = await self.rank.start()
                    logger.info("generation %d: started (pid %d)", generation, process.pid)
                    tasks.add(asyncio.ensure_future(_report_exit(writer, process, generation)))
                elif isinstance(generation := message.get("stop"), int):
                    await self.rank.stop(FOLLOWER_TERM_S)
                    _send(writer, {"stopped": generation})
        finally:
            for task in tasks:
                task.cancel()
            writer.close()


async def _report_exit(
    writer: asyncio.StreamWriter, process: asyncio.subprocess.Process, generation: int
) -> None:
    code = await process.wait()
    logger.info("generation %d: this rank's process exited with %s", generation, code)
    with contextlib.suppress(OSError):
        _send(writer, {"exited": generation, "code": code})


async def run_rank(
    settings: GroupSettings, command: Sequence[str], stopping: asyncio.Event
) -> None:
    """Run this rank as its group's leader (node rank 0) or a follower, until `stopping`."""
    member = Leader if settings.node_rank == 0 else Follower
    await member(settings, command).serve(stopping)
