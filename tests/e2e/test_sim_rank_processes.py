"""A two-node sim decode instance behind pdkit's load balancer: its ranks linked as SGLang's
are, a SIGKILLed rank takes the instance out of routing, and it is routed to again once it is
whole again (the test restarts the processes, as supervisord or systemd would)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from kit.lb.config import parse_args
from kit.lb.server import LoadBalancer
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, request_json, worker_argv

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "20", "PDKIT_SIM_GPU": "H100-SXM"}
HEALTH_INTERVAL_S = 0.5
EJECT_AFTER = 2
HEALTH = [
    "--health-interval",
    str(HEALTH_INTERVAL_S),
    "--health-timeout",
    "1",
    "--eject-after-failed-probes",
    str(EJECT_AFTER),
    "--readmit-after",
    "1",
]


def decode_ranks(dist_port: int) -> list[list[str]]:
    """argv of node ranks 0 and 1 of one decode instance (TP 2 over two one-GPU nodes)."""
    common = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist_port}"]
    return [
        worker_argv(
            port=free_port(),
            mode="decode",
            model=MODEL,
            served_name=MODEL,
            extra=[*common, "--node-rank", str(rank)],
        )
        for rank in (0, 1)
    ]


def test_a_killed_rank_takes_its_instance_out_of_routing_until_it_is_whole_again():
    boot = free_port()
    prefill = SimProcess(
        worker_argv(
            port=free_port(), mode="prefill", bootstrap_port=boot, model=MODEL, served_name=MODEL
        ),
        env=ENV,
    ).start()
    rank0_argv, rank1_argv = decode_ranks(free_port())
    rank0 = SimProcess(rank0_argv, env=ENV).start()
    rank1 = SimProcess(rank1_argv, env=ENV)
    started = [prefill, rank0, rank1]
    try:
        prefill.wait_ready()
        # Rank 0 has loaded but waits for rank 1 before it reports healthy.
        deadline = time.monotonic() + 20
        while "waiting for the other ranks" not in rank0.log():
            assert time.monotonic() < deadline, rank0.log()
            time.sleep(0.05)
        time.sleep(1.0)
        assert request_json(rank0.url + "/health", timeout_s=5)[0] == 503
        rank1.start().wait_ready()
        rank0.wait_ready()
        # The follower serves only the health endpoints and /metrics (with --enable-metrics),
        # as SGLang's follower nodes do.
        assert request_json(rank1.url + "/health_generate")[0] == 200
        assert request_json(rank1.url + "/metrics")[0] == 200
        assert request_json(rank1.url + "/generate", {"text": "x"})[0] == 404

        asyncio.run(asyncio.wait_for(_route_kill_and_recover(prefill, boot, started), 120))
    finally:
        for process in started:
            process.stop()


async def _route_kill_and_recover(
    prefill: SimProcess, boot: int, started: list[SimProcess]
) -> None:
    _, rank0, rank1 = started
    config = parse_args(["--prefill", prefill.url, str(boot), "--decode", rank0.url, *HEALTH], {})
    lb = LoadBalancer(config)
    await lb.start()
    runner = web.ServerRunner(lb.make_server(), shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    decode = lb.pool.get(rank0.url)
    assert decode is not None
    try:
        async with aiohttp.ClientSession() as session:
            await _until(lambda: lb.readiness_report()[0], 30, "the instance routed to")
            assert await _generate(session, url, 8) == 200

            # A long request in flight on rank 0 when rank 1 dies: it errors, as in SGLang.
            inflight = asyncio.ensure_future(_generate(session, url, 4000))
            await _until(lambda: decode.inflight > 0, 10, "the request in flight")
            rank1.kill()
            assert await asyncio.to_thread(rank0.proc.wait, 20) == -9  # kill_process_tree
            assert "SIGQUIT received. It usually means one child failed." in rank0.log()
            assert "node rank 1 of 2 is gone" in rank0.log()
            assert await inflight != 200
            # Out of routing within the health interval (at most eject_after_failed_probes).
            await _until(
                lambda: not decode.routable,
                EJECT_AFTER * HEALTH_INTERVAL_S + 2,
                "the decode instance out of routing",
            )
            assert not lb.readiness_report()[0]

            # The service manager restarts both; rank 0 serves again once rank 1 has joined.
            restarted = [SimProcess(p.argv, env=ENV).start() for p in (rank0, rank1)]
            started += restarted
            await asyncio.to_thread(restarted[0].wait_ready, 30)
            await _until(lambda: decode.routable, 10, "the instance routed to again")
            assert await _generate(session, url, 8) == 200
            # Stopped deliberately, rank 0 tells rank 1 to exit (SGLang's ShutdownReq): exit 0,
            # which a service manager does not restart.
            assert restarted[0].stop() == 0
            assert await asyncio.to_thread(restarted[1].proc.wait, 10) == 0
    finally:
        await runner.cleanup()
        await lb.close()


async def _generate(session: aiohttp.ClientSession, url: str, tokens: int) -> int:
    """A /generate through the load balancer; its status, or 0 when the connection broke."""
    body = {"text": "hello", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    try:
        async with session.post(url + "/generate", json=body) as resp:
            await resp.read()
            return resp.status
    except aiohttp.ClientError:
        return 0


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
