"""One sim worker process from start to stop.

Node rank 0 runs the engine, the HTTP API on ``--host:--port`` and, on a prefill, the
bootstrap server on ``--host:--disaggregation-bootstrap-port``. It listens at once and answers
503 on ``/health`` until the emulated model has loaded (``PDKIT_SIM_LOAD_SECONDS``); then the
prefill's ranks register on its bootstrap server and it logs SGLang's "The server is fired up
and ready to roll!".

A multi-node instance (``--nnodes``/``--node-rank``) is linked as SGLang's is (`kit.sim.ranks`):
node rank 0 listens on ``--dist-init-addr`` and reports healthy only once every other rank has
joined there; the followers join it, then serve only ``/health``, ``/health_generate`` and
``/ping`` (always 200), and ``/metrics`` (empty) with ``--enable-metrics``, on their
``--host:--port``, as SGLang's follower nodes do. The instance's
requests go to node rank 0, which emulates all its GPUs. When a rank is lost, the others die as
SGLang's do (`die_like_sglang`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web

from kit.net import bare_host
from kit.perf.clock import RealClock
from kit.sim.args import WorkerArgs
from kit.sim.bootstrap import BootstrapServer, rank_registration
from kit.sim.engine import Engine, StartupError
from kit.sim.ranks import RankError, RankServer, join_rank0
from kit.sim.server import Api, startup_phases
from kit.sim.settings import SimSettings

logger = logging.getLogger("kit.sim")

READY_LINE = "The server is fired up and ready to roll!"

RankLost = Callable[[str, int], None]
"""Called with what happened and this node rank when another rank of the instance is lost."""


def die_like_sglang(what: str, node_rank: int) -> None:
    """What SGLang 0.5.23 does when its scheduler raises (a rank on another node lost, see
    `kit.sim.ranks`; an input id outside the vocabulary): the scheduler's exception, the
    SIGQUIT to its parent, and `kill_process_tree` killing the whole process with SIGKILL, so
    every in-flight request loses its connection. `what` is the exception as SGLang logs it
    (``IndexError: ...``); a bare message is a RuntimeError's."""
    named = what.split(":", 1)[0].endswith("Error")
    logger.error("Scheduler hit an exception: %s", what if named else f"RuntimeError: {what}")
    if node_rank == 0:
        logger.error("SIGQUIT received. It usually means one child failed.")
    else:
        logger.error("Received sigquit from a child process. It usually means the child failed.")
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def advertised_ip(host: str, override: str | None) -> str:
    """The address peers reach this worker's transfer engine at: ``SGLANG_HOST_IP``, else
    ``--host``, else (for a wildcard) the primary address, else 127.0.0.1."""
    if override:
        return override
    bare = bare_host(host)
    try:
        wildcard = ipaddress.ip_address(bare).is_unspecified
    except ValueError:
        wildcard = False
    if not wildcard:
        return bare
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
        address: str = s.getsockname()[0]
        return address
    return "127.0.0.1"


async def _serve(app: web.Application, host: str, port: int, flag: str) -> web.AppRunner:
    """Listen on `host`:`port`; a port that cannot be bound is a `StartupError` naming the
    port and the flag (`flag`) that chose it."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, bare_host(host), port, reuse_address=True).start()
    except OSError as exc:
        await runner.cleanup()
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason = "address already in use"
        raise StartupError(
            f"cannot listen on {host}:{port} ({flag} {port}): {reason}. To fix: stop the "
            f"process using port {port}, or choose another {flag}."
        ) from exc
    return runner


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` unless `stop` is set first; True when stopped."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _until_stop_or(stop: asyncio.Event, lost: asyncio.Future[str | None]) -> str | None:
    """Wait for `stop` or the end of the link to another rank: what was lost, or None when
    stopped (here, or by rank 0's shutdown)."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((stopped, lost), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    return lost.result() if lost.done() and not stop.is_set() else None


async def _joined_or_stopped(ranks: RankServer, stop: asyncio.Event) -> bool:
    """Wait until every rank has joined (False) or `stop` is set (True); `RankError` when a
    joined rank is lost first."""
    joined = asyncio.ensure_future(ranks.wait_all())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((joined, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not joined.done():
            joined.cancel()
    if joined.done() and not joined.cancelled():
        joined.result()  # raises RankError
        return False
    return True


async def run_follower(
    args: WorkerArgs, settings: SimSettings, stop: asyncio.Event, on_lost: RankLost
) -> int:
    """Node rank > 0: join rank 0, then health endpoints only (see the module doc)."""
    assert args.dist_init_addr is not None  # parse_args requires it with --nnodes > 1
    if await _wait(stop, settings.load_seconds):
        return 0
    link = await join_rank0(args.dist_init_addr, args.node_rank, args.nnodes, stop)
    if link is None:
        return 0
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    for path in ("/health", "/health_generate", "/ping"):
        app.router.add_get(path, ok)
    if args.enable_metrics:
        # SGLang's follower serves its node's multiprocess registry; with no scheduler of an
        # attention-TP rank 0 on the node (plain TP across nodes) it holds no sglang: series,
        # and the sim's rank 0 emulates every rank's, so this one is empty.
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(
                body=b"", headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
            )

        app.router.add_get("/metrics", metrics)
    lost = asyncio.ensure_future(link.wait_lost())
    try:
        runner = await _serve(app, args.host, args.port, "--port")
        logger.info(
            "sim: node rank %d of %d: health and metrics endpoints only on %s:%d; node rank 0 (%s) "
            "serves the instance",
            args.node_rank,
            args.nnodes,
            args.host,
            args.port,
            args.dist_init_addr,
        )
        try:
            what = await _until_stop_or(stop, lost)
            if what is None:
                return 0
            on_lost(what, args.node_rank)
            return 1
        finally:
            await runner.cleanup()
    finally:
        lost.cancel()
        await link.close()


async def run_worker(
    args: WorkerArgs,
    settings: SimSettings,
    stop: asyncio.Event,
    on_lost: RankLost = die_like_sglang,
) -> int:
    """Node rank 0: the whole worker; a follower rank: `run_follower`. Returns the process exit
    code; `on_lost` is called (and 1 returned) when another rank of the instance is lost."""
    if args.node_rank > 0:
        return await run_follower(args, settings, stop, on_lost)
    ranks = None
    if args.nnodes > 1:
        assert args.dist_init_addr is not None  # parse_args requires it with --nnodes > 1
        ranks = RankServer(args.dist_init_addr, args.nnodes)
        await ranks.start()
    try:
        return await _run_rank0(args, settings, stop, ranks, on_lost)
    finally:
        if ranks is not None:
            await ranks.close(shutdown=stop.is_set())


async def _run_rank0(
    args: WorkerArgs,
    settings: SimSettings,
    stop: asyncio.Event,
    ranks: RankServer | None,
    on_lost: RankLost,
) -> int:
    """Serve until stopped (0) or until another rank is lost: then `on_lost` at once, while
    requests are still in flight (as SGLang dies), and 1."""
    began = time.monotonic()
    loop = asyncio.get_running_loop()
    engine = Engine(args, settings, RealClock(loop, settings.speed))
    engine.on_fatal = lambda what: die_like_sglang(what, args.node_rank)
    host_ip = advertised_ip(args.host, settings.host_ip)
    engine.start_transfer_engine(host_ip)
    engine.start_kv_pool()
    api = Api(engine)
    runners: list[web.AppRunner] = []
    try:
        runners.append(await _serve(api.app(), args.host, args.port, "--port"))
        bootstrap = None
        # With the role switch every PD instance runs its bootstrap server (SGLang's
        # start_disagg_service), so that one flipped to prefill has it already.
        if args.disaggregation_mode == "prefill" or (args.enable_pd_role_switch and args.is_pd):
            bootstrap = BootstrapServer(engine.rooms)
            runners.append(
                await _serve(
                    bootstrap.app,
                    args.host,
                    args.disaggregation_bootstrap_port,
                    "--disaggregation-bootstrap-port",
                )
            )
        logger.info(
            "sim: %s worker for %s on %d x %s (%s), KV pool %d tokens x %d rank(s), "
            "max running %d, chunked prefill %d; HTTP %s:%d%s",
            args.disaggregation_mode,
            engine.model.name,
            engine.gpus,
            engine.gpu.name,
            f"speed x{settings.speed:g}",
            engine.capacity_tokens,
            len(engine.ranks),
            engine.max_running,
            engine.chunk_size,
            args.host,
            args.port,
            f", bootstrap :{args.disaggregation_bootstrap_port}" if bootstrap else "",
        )
        loading = time.monotonic()
        if await _wait(stop, settings.load_seconds):
            return 0
        loaded = time.monotonic()
        if ranks is not None:
            try:
                if await _joined_or_stopped(ranks, stop):
                    return 0
            except RankError as exc:
                on_lost(str(exc), 0)
                return 1

        def register(role: str) -> None:
            if bootstrap is None or role != "prefill":
                return
            for rank in range(len(engine.ranks)):
                bootstrap.register(
                    rank_registration(
                        rank_ip=host_ip,
                        rank_port=args.disaggregation_bootstrap_port,
                        dp_size=len(engine.ranks),
                        dp_rank=rank,
                        tp_size=args.tp_size,
                        page_size=args.page_size,
                        kv_cache_dtype=args.kv_cache_dtype,
                        http_port=args.port,
                    )
                )

        register(args.disaggregation_mode)
        api.on_role_switch = register
        api.startup_time = startup_phases(loaded - loading, time.monotonic() - began)
        api.ready = True
        logger.info(READY_LINE)
        if ranks is None:
            await stop.wait()
            return 0
        lost: asyncio.Future[str | None] = asyncio.ensure_future(ranks.wait_lost())
        try:
            what = await _until_stop_or(stop, lost)
        finally:
            lost.cancel()
        if what is None:
            return 0
        on_lost(what, 0)
        return 1
    finally:
        api.stopping = True
        for runner in reversed(runners):
            await runner.cleanup()
        await engine.close()
