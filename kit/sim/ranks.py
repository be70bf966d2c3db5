"""The link between the node ranks of a multi-node instance, emulated as SGLang 0.5.23 has it.

SGLang: every node of an instance joins torch.distributed at rank 0's ``--dist-init-addr``
(a TCPStore there); rank 0 starts serving HTTP only once the schedulers of every node have
initialised. After that the TP ranks exchange data at every scheduler step: rank 0 broadcasts
the step's requests to the others over the gloo CPU group (``broadcast_pyobj`` in
``Scheduler.recv_requests``), and the forward passes all-reduce over NCCL. When a rank on
another node dies, rank 0's next broadcast fails ("Connection closed by peer"); its scheduler
logs "Scheduler hit an exception", sends SIGQUIT to its parent, which logs "SIGQUIT received
... It usually means one child failed" and kills its whole process tree, itself included, with
SIGKILL (``kill_process_tree``). `/health` stops answering and every in-flight request loses
its connection; the service manager restarts the process, which serves again only once every
node has joined again. A follower whose rank 0 dies fails the same way. A peer that hangs
instead of dying (no TCP reset) stalls the step: `/health` then answers 503 after
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) and the scheduler watchdog (``--watchdog-timeout``,
300 s) kills the process; the sim does not emulate that case.

The sim's link: rank 0 listens on ``--dist-init-addr``; each follower connects and sends one
line ``{"node_rank": R, "nnodes": N}``; rank 0 answers ``{"ok": true}`` or ``{"error": ...}``
and both keep the connection open. Its end (EOF, reset) on either side is the loss of a rank.
A rank 0 that is stopped (SIGTERM) first sends ``{"shutdown": true}``, on which its followers
exit cleanly: SGLang's followers ignore SIGTERM and wait for rank 0's ShutdownReq.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from kit.net import split_host_port
from kit.sim.engine import StartupError

logger = logging.getLogger("kit.sim.ranks")

JOIN_RETRY_S = 0.5
"""Seconds between a follower's attempts to join rank 0 (torch's TCPStore client retries too)."""
JOIN_LOG_EVERY_S = 10.0
HELLO_TIMEOUT_S = 5.0
MAX_LINE = 4096
SHUTDOWN = b'{"shutdown": true}\n'
"""What rank 0 sends its followers when it is stopped (SGLang's ShutdownReq broadcast)."""
RETRY_PREFIX = "retry: "
"""Refusals that a later attempt may not get (rank 0 still holds the rank, or is going away)."""


class RankError(RuntimeError):
    """A rank of the instance was lost; the message says which, in SGLang's words."""


class RankServer:
    """Node rank 0's end: accepts the followers, says when all have joined and when one is lost."""

    def __init__(self, dist_init_addr: str, nnodes: int) -> None:
        self.addr = dist_init_addr
        self.nnodes = nnodes
        self._server: asyncio.Server | None = None
        self._joined: dict[int, asyncio.StreamWriter] = {}
        self._all = asyncio.Event()
        self._lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def joined(self) -> tuple[int, ...]:
        """Node ranks connected now (rank 0 included)."""
        return (0, *sorted(self._joined))

    async def start(self) -> None:
        """Listen on ``--dist-init-addr``; a `StartupError` naming the flag if it cannot."""
        host, port = split_host_port(self.addr)
        try:
            self._server = await asyncio.start_server(
                self._accept, host, port, reuse_address=True, limit=MAX_LINE
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {self.addr} (--dist-init-addr): {exc.strerror or exc}. To fix: "
                f"stop the process using port {port}, or choose another --dist-init-addr port."
            ) from exc
        logger.info(
            "sim: node rank 0 of %d: waiting for the other ranks at %s", self.nnodes, self.addr
        )

    async def wait_all(self) -> None:
        """Until every node rank has joined; raises `RankError` if one is lost first."""
        waiter: asyncio.Future[object] = asyncio.ensure_future(self._all.wait())
        lost: asyncio.Future[object] = asyncio.shield(self._lost)
        try:
            await asyncio.wait((waiter, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            lost.cancel()
        if self._lost.done():
            raise RankError(self._lost.result())

    async def wait_lost(self) -> str:
        """Until a joined rank is lost; what happened, in SGLang's words."""
        return await asyncio.shield(self._lost)

    async def close(self, shutdown: bool = False) -> None:
        """Stop listening and drop every connection. `shutdown` (a deliberate stop) first tells
        the joined ranks to exit, as SGLang's rank 0 broadcasts its ShutdownReq; without it
        each follower sees its rank 0 lost."""
        if self._server is not None:
            self._server.close()
        for writer in self._joined.values() if shutdown else ():
            with contextlib.suppress(OSError):
                writer.write(SHUTDOWN)
        for writer in self._writers:
            writer.close()
        # Each connection's task ends on its closed transport.
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            rank = await self._hello(reader, writer)
            if rank is None:
                writer.close()
                return
            # The connection stays open until the follower (or this process) goes away.
            while await reader.read(MAX_LINE):
                pass
            if self._joined.get(rank) is writer and not self._lost.done():
                self._lose(
                    f"node rank {rank} of {self.nnodes} is gone (its connection to "
                    f"{self.addr} closed): Connection closed by peer"
                )
        except (ConnectionError, OSError) as exc:
            if not self._lost.done():
                self._lose(f"the connection of a node rank broke: {exc}")
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    def _lose(self, what: str) -> None:
        """A rank is gone: this rank 0 fails as a whole. It takes no rank any more and drops
        the others (they fail too, as SGLang's followers do), and says what happened."""
        self._lost.set_result(what)
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()

    async def _hello(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> int | None:
        """Read a follower's hello and answer it; its node rank, or None when refused."""
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            hello = json.loads(line)
            rank, nnodes = int(hello["node_rank"]), int(hello["nnodes"])
        except (TimeoutError, ValueError, KeyError, TypeError):
            return None
        error = None
        if self._lost.done():
            error = f"{RETRY_PREFIX}node rank 0 is going away: {self._lost.result()}"
        elif nnodes != self.nnodes:
            error = f"node rank 0 runs --nnodes {self.nnodes}, node rank {rank} --nnodes {nnodes}"
        elif not 0 < rank < self.nnodes:
            error = f"--node-rank {rank} is not a follower rank of --nnodes {self.nnodes}"
        elif rank in self._joined:
            error = f"{RETRY_PREFIX}node rank {rank} has joined already"
        if error is not None:
            writer.write((json.dumps({"error": error}) + "\n").encode())
            await writer.drain()
            return None
        writer.write(b'{"ok": true}\n')
        await writer.drain()
        self._joined[rank] = writer
        logger.info("sim: node rank %d joined (%d of %d)", rank, len(self._joined) + 1, self.nnodes)
        if len(self._joined) == self.nnodes - 1:
            self._all.set()
        return rank


class RankLink:
    """A follower's joined connection to node rank 0."""

    def __init__(
        self, addr: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.addr = addr
        self._reader = reader
        self._writer = writer

    async def wait_lost(self) -> str | None:
        """Until rank 0 goes away: what happened, in SGLang's words; None when rank 0 stopped
        the instance deliberately (its shutdown), on which this rank exits too."""
        try:
            while line := await self._reader.readline():
                if line == SHUTDOWN:
                    return None
        except (ConnectionError, OSError, ValueError) as exc:
            return f"node rank 0 at {self.addr} is gone: {exc}"
        return f"node rank 0 at {self.addr} is gone: Connection closed by peer"

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


async def join_rank0(
    dist_init_addr: str, node_rank: int, nnodes: int, stop: asyncio.Event
) -> RankLink | None:
    """Connect to node rank 0, retrying until it listens and takes this rank (a rank 0 that is
    going away may still hold the rank's old connection); None when `stop` is set first.
    Raises `StartupError` when the ranks disagree (--nnodes, a --node-rank out of range)."""
    host, port = split_host_port(dist_init_addr)
    next_log = 0.0
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        if loop.time() >= next_log:
            logger.info("sim: node rank %d: joining node rank 0 at %s", node_rank, dist_init_addr)
            next_log = loop.time() + JOIN_LOG_EVERY_S
        answer = await _hello(host, port, node_rank, nnodes)
        if isinstance(answer, tuple):
            logger.info(
                "sim: node rank %d of %d joined node rank 0 at %s",
                node_rank,
                nnodes,
                dist_init_addr,
            )
            return RankLink(dist_init_addr, *answer)
        if answer is not None and not answer.startswith(RETRY_PREFIX):
            raise StartupError(
                f"node rank 0 at {dist_init_addr} (--dist-init-addr) refused node rank "
                f"{node_rank}: {answer}. To fix: give every node of the instance the same "
                "--nnodes and its own --node-rank."
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), JOIN_RETRY_S)
    return None


async def _hello(
    host: str, port: int, node_rank: int, nnodes: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | str | None:
    """One attempt: the open connection when rank 0 took this rank, its refusal, or None when
    it could not be reached."""
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
    except OSError:
        return None
    try:
        writer.write((json.dumps({"node_rank": node_rank, "nnodes": nnodes}) + "\n").encode())
        await writer.drain()
        answer = json.loads(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S) or b"{}")
    except (OSError, TimeoutError, ValueError):
        writer.close()
        return None
    if isinstance(answer, dict) and answer.get("ok") is True:
        return reader, writer
    writer.close()
    return str(answer.get("error") if isinstance(answer, dict) else answer) or None
