"""The load balancer process: parse the command line, serve, drain on SIGTERM, exit.

Exit status: 0 after a clean stop (SIGTERM or SIGINT), 1 when it cannot run (e.g. the port is
taken), 2 for a bad command line.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from aiohttp import web

from kit.aio import loop_factory
from kit.lb.access import send_to
from kit.lb.config import LbConfig, parse_args
from kit.lb.errors import LbConfigError, LbError
from kit.lb.processes import ProcessGroup, supervise
from kit.lb.server import LoadBalancer
from kit.lb.tls import ServerTls

log = logging.getLogger("kit.lb")


async def serve(
    config: LbConfig,
    *,
    on_ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    group: ProcessGroup | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop` is set), then drain for up to `drain_grace` s.

    `on_ready` gets the bound port once listening (useful with `--port 0` in tests); `group`
    is this process's place among several on the port (`kit.lb.processes`).
    """
    tls = ServerTls(config.tls_cert, config.tls_key) if config.tls_cert else None
    lb = LoadBalancer(config, group)
    await lb.start()
    runner = web.ServerRunner(
        lb.make_server(), handle_signals=False, shutdown_timeout=config.drain_grace
    )
    await runner.setup()
    site = web.TCPSite(
        runner,
        config.host,
        config.port,
        backlog=4096,
        reuse_address=True,
        reuse_port=group is not None,
        ssl_context=tls.context if tls else None,
    )
    try:
        await site.start()
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
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    loop.add_signal_handler(signal.SIGHUP, _reload(tls))
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
    try:
        await stop_event.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if group is not None:
            # systemd signals every process of the unit and the supervisor passes its own on:
            # a second SIGTERM must not cut this one's drain.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        lb.start_drain()
        log.info("draining: %d requests in flight, grace %g s", lb.inflight, config.drain_grace)
        await runner.cleanup()  # stops listening, waits for handlers up to the grace period
        if group is not None:
            await group.close()
        await lb.close()
        log.info("stopped")


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
    # SIGHUP reloads (`pdkit up`): until the loop handles it, it must not stop the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if config.processes > 1:
        return supervise(config, _run)  # forks before any loop or thread exists
    return _run(config, None)


def _run(config: LbConfig, group: ProcessGroup | None) -> int:
    """Serve in this process; the exit status."""
    if config.access_log:
        send_to(sys.stderr)  # bare `access {json}` lines, written in batches
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(config, group=group))
    except LbError as exc:
        print(f"pdkit lb: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
