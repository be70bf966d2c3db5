"""The load balancer process: parse the command line, serve, drain on SIGTERM, exit; on SIGUSR2
hand its listening socket over to a new process with the same PID.

The handover (`pdkit up` with changed router settings, `pdkit restart ... router`) loses no
request and refuses no connection:
    1. SIGUSR2: the socket is kept open (a duplicate of its descriptor, inheritable), so the
       kernel keeps queueing new connections on it; nothing accepts them meanwhile.
    2. The server stops accepting and finishes its in-flight requests, as on SIGTERM (up to
       --drain-grace s) but without refusing the ones that still arrive on open connections;
       each connection is closed after its request, so its client reconnects to the queue.
    3. The process execs its launch script again ($PDKIT_LB_RELAUNCH; by hand: the same command
       line), which reads the current settings, with the socket's descriptor in
       $PDKIT_LB_LISTEN_FD; the new image serves on that socket and accepts the queued
       connections. The PID stays, so supervisord and systemd see one process throughout.
Queued connections wait for step 2 and the new image's start (seconds), not refused. A group
of processes (--processes N) hands over without a wait: its supervisor execs the new image
at once, which starts a new group on the same sockets and only then tells the old one to
finish (`kit.lb.processes`); the sockets themselves are in `kit.lb.listen`.

Exit status: 0 after a clean stop (SIGTERM or SIGINT), 1 when it cannot run (e.g. the port is
taken), 2 for a bad command line.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence

from aiohttp import web

from kit.aio import loop_factory
from kit.lb.access import send_to
from kit.lb.config import LbConfig, parse_args
from kit.lb.errors import LbConfigError, LbError
from kit.lb.listen import listeners, relaunch
from kit.lb.processes import ProcessGroup, handed_over_group, supervise
from kit.lb.server import LoadBalancer
from kit.lb.tls import ServerTls

ACCEPTED_SETTLE_S = 0.2
"""Seconds between the last accept and the shutdown of a drain or handover: for the requests of
connections accepted just before to be read (they are then served, not cut)."""

log = logging.getLogger("kit.lb")


async def serve(
    config: LbConfig,
    *,
    on_ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    group: ProcessGroup | None = None,
    handover: asyncio.Event | None = None,
    sockets: list[socket.socket] | None = None,
) -> list[socket.socket] | None:
    """Serve until SIGTERM/SIGINT (or `stop` is set), then drain for up to `drain_grace` s; on
    SIGUSR2 (or `handover` set) finish the in-flight requests likewise, keeping the sockets
    (the module doc).

    `sockets`: the listening sockets to serve (a group's child gets its share from the
    supervisor, `kit.lb.listen`); None: this process's own (inherited through a handover, else
    bound to --host/--port). `on_ready` gets the bound port once listening (useful with
    `--port 0` in tests); `group` is this process's place among several on the port
    (`kit.lb.processes`). Returns None after a stop or a group child's handover (its
    supervisor keeps the sockets), a single process's kept sockets after a handover's drain
    (`kit.lb.listen.relaunch`).
    """
    socks = sockets if sockets is not None else listeners(config, 1)
    tls = ServerTls(config.tls_cert, config.tls_key) if config.tls_cert else None
    lb = LoadBalancer(config, group)
    await lb.start()
    runner = web.ServerRunner(
        lb.make_server(), handle_signals=False, shutdown_timeout=config.drain_grace
    )
    await runner.setup()
    context = tls.context if tls else None
    try:
        for sock in socks:
            await web.SockSite(runner, sock, ssl_context=context).start()
    except OSError as exc:
        await runner.cleanup()
        await lb.close()
        raise LbError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror}. "
            "To fix: pick a free --port or stop what holds it."
        ) from exc
    if group is not None:
        await group.start(runner, lb)
    stop_event = stop or asyncio.Event()
    handover_event = handover or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    loop.add_signal_handler(signal.SIGHUP, _reload(tls))
    loop.add_signal_handler(signal.SIGUSR2, handover_event.set)
    # Everything allocated so far lives as long as the process: keep the collector off it, so
    # that full collections (pauses in the request path) stay short.
    gc.collect()
    gc.freeze()
    port = runner.addresses[0][1] if runner.addresses else config.port
    log.info(
        "pdkit lb listening on %s:%d: %d prefill (%s), %d decode (%s)",
        config.host,
        port,
        len(config.prefill),
        config.prefill_policy,
        len(config.decode),
        config.decode_policy,
    )
    if on_ready is not None:
        on_ready(port)
    kept: list[socket.socket] | None = None
    try:
        waits = [asyncio.ensure_future(e.wait()) for e in (stop_event, handover_event)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            loop.remove_signal_handler(sig)
        # A second SIGUSR2 or a SIGHUP during the drain must not stop the process.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        if group is not None:
            # systemd signals every process of the unit and the supervisor passes its own on:
            # a second SIGTERM must not cut this one's drain.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if handover_event.is_set() and not stop_event.is_set():
            if group is None:  # the kernel keeps queueing connections on the kept sockets
                kept = [socket.socket(fileno=os.dup(s.fileno())) for s in socks]
            lb.start_handover()
            log.info("handover: %d requests in flight, grace %g s", lb.inflight, config.drain_grace)
        else:
            lb.start_drain()
            log.info("draining: %d requests in flight, grace %g s", lb.inflight, config.drain_grace)
        for site in list(runner.sites):  # stop accepting
            await site.stop()
        # A connection accepted just before may not have been read yet: aiohttp's shutdown
        # closes at once a connection with no request in progress, and its client, which had
        # sent the request, sees the connection closed under it. A moment for those bytes.
        await asyncio.sleep(min(ACCEPTED_SETTLE_S, config.drain_grace))
        await runner.cleanup()  # waits for the handlers in progress up to the grace period
        if group is not None:
            await group.close()
        await lb.close()
        log.info("stopped" if kept is None else "handing over")
    return kept


def _reload(tls: ServerTls | None) -> Callable[[], None]:
    """SIGHUP: read the TLS files again; without TLS there is nothing to read (logged)."""

    def reload() -> None:
        if tls is None:
            log.info("SIGHUP: no TLS files to read again")
        else:
            tls.reload()

    return reload


def main(argv: Sequence[str] | None = None) -> int:
    """`pdkit lb ARGS` / `python -m kit.lb ARGS`; returns the exit status."""
    try:
        config = parse_args(argv)
    except LbConfigError as exc:
        print(f"pdkit lb: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # SIGHUP reloads (`pdkit up`) and SIGUSR2 hands over: until the loop (or the supervisor)
    # handles them, neither may stop the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        if config.processes > 1 or handed_over_group():
            return supervise(config, _run)  # forks before any loop or thread exists
        return _run(config, None, listeners(config, 1))
    except LbError as exc:
        print(f"pdkit lb: {exc}", file=sys.stderr)
        return 1


def _run(config: LbConfig, group: ProcessGroup | None, sockets: list[socket.socket]) -> int:
    """Serve `sockets` in this process; the exit status."""
    if config.access_log:
        send_to(sys.stderr)  # bare `access {json}` lines, written in batches
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            kept = runner.run(serve(config, group=group, sockets=sockets))
        if kept is not None:
            relaunch(kept)
    except LbError as exc:
        print(f"pdkit lb: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
