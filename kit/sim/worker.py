"""One sim worker process from start to stop.

Node rank 0 runs the engine, the HTTP API on ``--host:--port`` and, on a prefill, the
bootstrap server on ``--host:--disaggregation-bootstrap-port``. It listens at once and answers
503 on ``/health`` until the emulated model has loaded (``PDKIT_SIM_LOAD_SECONDS``); then the
prefill's ranks register on its bootstrap server and it logs SGLang's "The server is fired up
and ready to roll!".

A node rank > 0 of a multi-node instance (``--nnodes``/``--node-rank``) does what SGLang's
follower nodes do at the HTTP level: after loading, it serves only ``/health``,
``/health_generate`` and ``/ping`` (always 200) on its ``--host:--port`` and stays up until
stopped; the instance's requests go to node rank 0, which emulates all its GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import time

from aiohttp import web

from kit.net import bare_host
from kit.perf.clock import RealClock
from kit.sim.args import WorkerArgs
from kit.sim.bootstrap import BootstrapServer, rank_registration
from kit.sim.engine import Engine, StartupError
from kit.sim.server import Api, startup_phases
from kit.sim.settings import SimSettings

logger = logging.getLogger("kit.sim")

READY_LINE = "The server is fired up and ready to roll!"


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


async def run_follower(args: WorkerArgs, settings: SimSettings, stop: asyncio.Event) -> int:
    """Node rank > 0: health endpoints only (see the module doc)."""
    if await _wait(stop, settings.load_seconds):
        return 0
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    for path in ("/health", "/health_generate", "/ping"):
        app.router.add_get(path, ok)
    runner = await _serve(app, args.host, args.port, "--port")
    logger.info(
        "sim: node rank %d of %d: health endpoints only on %s:%d; node rank 0 (%s) "
        "serves the instance",
        args.node_rank,
        args.nnodes,
        args.host,
        args.port,
        args.dist_init_addr,
    )
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


async def run_worker(args: WorkerArgs, settings: SimSettings, stop: asyncio.Event) -> int:
    """Node rank 0: the whole worker. Returns the process exit code."""
    if args.node_rank > 0:
        return await run_follower(args, settings, stop)
    began = time.monotonic()
    loop = asyncio.get_running_loop()
    engine = Engine(args, settings, RealClock(loop, settings.speed))
    host_ip = advertised_ip(args.host, settings.host_ip)
    engine.start_transfer_engine(host_ip)
    api = Api(engine)
    runners: list[web.AppRunner] = []
    try:
        runners.append(await _serve(api.app(), args.host, args.port, "--port"))
        bootstrap = None
        if args.disaggregation_mode == "prefill":
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
        if bootstrap is not None:
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
        api.startup_time = startup_phases(loaded - loading, time.monotonic() - began)
        api.ready = True
        logger.info(READY_LINE)
        await stop.wait()
        api.stopping = True
        return 0
    finally:
        api.stopping = True
        for runner in reversed(runners):
            await runner.cleanup()
        await engine.close()
