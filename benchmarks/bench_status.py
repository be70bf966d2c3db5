"""How long one status round takes against the number of workers (`make bench-status`).

One lightweight server process (aiohttp, loopback only) listens on one port per emulated
worker and answers like a sim worker (/health, /server_info, /v1/loads, /metrics), plus one
router port and one port that accepts requests and never answers. Each run probes N workers,
one of which is the silent one, so every round waits one probe timeout for it: the point is
that the other N-1 are probed while that timeout runs, so 256 workers cost about what 8 do.
A second row per N probes only answering workers, to show the probing cost itself.

    .venv/bin/python -m benchmarks.bench_status [--timeout 1.0] [--repeat 3]

Prints the median round time per worker count and the ratio 256 vs 8; exits 1 when 256
workers take 2x the time of 8 or more, or when a round misjudges a worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

from aiohttp import web

from kit.observe.probe import DEFAULT_CONCURRENCY
from kit.observe.run import ProbeOptions, probe_once
from kit.observe.targets import Expected, RouterTarget, Targets, WorkerTarget
from kit.topology.schema import SLO

SIZES = (8, 32, 128, 256)
MODEL = "bench-model"
VERSION = "0.5.23"


def _metrics_text(role: str, port: int) -> str:
    """A worker's page; the values differ per port, as they do between real workers."""
    labels = f'model_name="{MODEL}",engine_type="{role}",tp_rank="0"'
    lines = [
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{labels}}} 3.0",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{labels}}} 1.0",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{{{labels}}} 0.25",
        "# TYPE sglang:gen_throughput gauge",
        f"sglang:gen_throughput{{{labels}}} {port / 10:.1f}",
        "# TYPE sglang:num_transfer_failed_reqs_total counter",
        f"sglang:num_transfer_failed_reqs_total{{{labels}}} 0.0",
        "# TYPE sglang:kv_transfer_latency_ms histogram",
    ]
    cumulative = 0
    for bound, count in ((1.0, 2), (5.0, 10), (10.0, 20), (50.0, 3), (100.0, 0)):
        cumulative += count
        lines.append(f'sglang:kv_transfer_latency_ms_bucket{{{labels},le="{bound}"}} {cumulative}')
    lines += [
        f'sglang:kv_transfer_latency_ms_bucket{{{labels},le="+Inf"}} {cumulative}',
        f"sglang:kv_transfer_latency_ms_sum{{{labels}}} 250.0",
        f"sglang:kv_transfer_latency_ms_count{{{labels}}} {cumulative}",
    ]
    return "\n".join(lines) + "\n"


def _serve(workers: int) -> None:
    """The server process: print the ports as one JSON line, serve until stdin closes."""
    sockets = []
    for _ in range(workers + 2):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sockets.append(sock)
    ports = [s.getsockname()[1] for s in sockets]
    worker_ports, hung_port, router_port = ports[:workers], ports[workers], ports[workers + 1]
    roles = {p: ("prefill" if i % 2 == 0 else "decode") for i, p in enumerate(worker_ports)}
    metrics = {p: _metrics_text(role, p) for p, role in roles.items()}
    started = time.time()

    def port_of(request: web.Request) -> int:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return int(sockname[1]) if sockname else 0

    async def health(request: web.Request) -> web.StreamResponse:
        port = port_of(request)
        if port == hung_port:
            await asyncio.Event().wait()  # never answers
        if port == router_port:
            return web.json_response({"status": "ok"})
        return web.Response(status=200)

    async def server_info(request: web.Request) -> web.StreamResponse:
        port = port_of(request)
        if port == hung_port:
            await asyncio.Event().wait()
        role = roles.get(port, "decode")
        return web.json_response(
            {
                "served_model_name": MODEL,
                "model_path": MODEL,
                "disaggregation_mode": role,
                "tp_size": 1,
                "version": VERSION,
                "engine": "pdkit-sim",
                "sim": {"started_at": started},
                "internal_states": [{}],
            }
        )

    async def loads(request: web.Request) -> web.StreamResponse:
        if port_of(request) == hung_port:
            await asyncio.Event().wait()
        disagg = {"mode": roles.get(port_of(request), "decode"), "prefill_bootstrap_queue_reqs": 1}
        entry = {
            "dp_rank": 0,
            "num_running_reqs": 3,
            "num_waiting_reqs": 1,
            "token_usage": 0.25,
            "gen_throughput": 812.5,
            "disaggregation": disagg,
        }
        return web.json_response({"version": VERSION, "loads": [entry]})

    async def prometheus(request: web.Request) -> web.StreamResponse:
        port = port_of(request)
        if port == hung_port:
            await asyncio.Event().wait()
        if port == router_port:
            return web.Response(
                text="# TYPE pdkit_lb_requests_total counter\n"
                'pdkit_lb_requests_total{route="generate",status="200"} 5\n'
            )
        return web.Response(text=metrics[port])

    async def readiness(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ready": True, "draining": False})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/server_info", server_info)
        app.router.add_get("/v1/loads", loads)
        app.router.add_get("/metrics", prometheus)
        app.router.add_get("/readiness", readiness)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        for sock in sockets:
            await web.SockSite(runner, sock).start()
        print(
            json.dumps({"workers": worker_ports, "hung": hung_port, "router": router_port}),
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # The parent closes our stdin (or dies): then stop.
        threading.Thread(
            target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True
        ).start()
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


def _targets(ports: list[int], hung: int | None, router: int) -> Targets:
    workers = []
    for i, port in enumerate([*ports, *([hung] if hung is not None else [])]):
        role = "prefill" if i % 2 == 0 else "decode"
        workers.append(
            WorkerTarget(
                name=f"{role}-{i // 2}",
                role=role,
                instance=i // 2,
                host="localhost",
                url=f"http://127.0.0.1:{port}",
                nnodes=1,
                expected=Expected(MODEL, role, "sim", VERSION, None, 1),
            )
        )
    return Targets(
        deployment="bench",
        workers=tuple(workers),
        router=RouterTarget(
            "router",
            "pdkit",
            "localhost",
            f"http://127.0.0.1:{router}",
            f"http://127.0.0.1:{router}/metrics",
            None,
        ),
        slo=SLO(),
    )


def _round(targets: Targets, options: ProbeOptions, hung: bool) -> float:
    started = time.perf_counter()
    report = asyncio.run(probe_once(targets, options))
    seconds = time.perf_counter() - started
    healthy = sum(w.healthy for w in report.workers)
    expected = len(targets.workers) - (1 if hung else 0)
    if healthy != expected:
        raise SystemExit(f"misjudged: {healthy} healthy workers, expected {expected}")
    if hung and report.workers[-1].state != "unhealthy":
        raise SystemExit(f"the silent endpoint was judged {report.workers[-1].state}")
    return seconds


def bench(timeout: float, repeat: int, concurrency: int) -> int:
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_status", "--serve", str(max(SIZES))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ports = json.loads(server.stdout.readline())
        options = ProbeOptions(timeout_s=timeout, concurrency=concurrency)
        print(
            f"status round time (median of {repeat}), probe timeout {timeout:g} s, "
            f"concurrency {concurrency}, 4 requests per worker, one server process"
        )
        print(f"{'workers':>8} {'with 1 silent':>14} {'all answering':>14}")
        with_silent: dict[int, float] = {}
        for n in SIZES:
            slow = _targets(ports["workers"][: n - 1], ports["hung"], ports["router"])
            fast = _targets(ports["workers"][:n], None, ports["router"])
            _round(fast, options, hung=False)  # warm-up: imports, first connections
            with_silent[n] = statistics.median(
                _round(slow, options, hung=True) for _ in range(repeat)
            )
            answering = statistics.median(_round(fast, options, hung=False) for _ in range(repeat))
            print(f"{n:>8} {with_silent[n]:>13.3f}s {answering:>13.3f}s")
        ratio = with_silent[max(SIZES)] / with_silent[min(SIZES)]
        bounded = with_silent[max(SIZES)] < timeout * 2
        ok = ratio < 2 and bounded
        print(
            f"ratio {max(SIZES)} vs {min(SIZES)} workers: {ratio:.2f}x (must be < 2x); "
            f"{max(SIZES)} workers with a silent one: {with_silent[max(SIZES)]:.2f} s for a "
            f"{timeout:g} s timeout -> {'OK' if ok else 'FAIL'}"
        )
        return 0 if ok else 1
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=1.0, help="probe timeout (s)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (median)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--serve", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    return bench(args.timeout, args.repeat, args.concurrency)


if __name__ == "__main__":
    sys.exit(main())
