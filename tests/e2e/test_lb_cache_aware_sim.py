"""cache_aware in front of emulated workers that publish SGLang's KV events for real (ZMQ):
2 prefills (one with 2 DP ranks) and 1 decode, PD over Mooncake, pdkit's router in-process.

The router hashes the text prompts with the sim's tokenizer (learnt from /server_info), looks
them up in what the prefills' events said, picks the rank through the bootstrap room, and the
prefill's own meta_info.cached_tokens says whether it was right.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
from aiohttp import web

from kit.byte_tokenizer import encode
from kit.lb.config import parse_args
from kit.lb.protocol import parse_request
from kit.lb.server import LoadBalancer
from tests.support.lb_cluster import FAST_HEALTH, run
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, worker_argv

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "20", "PDKIT_SIM_GPU": "H100-SXM"}


def kv_events(port: int) -> list[str]:
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    return ["--kv-events-config", json.dumps(config)]


class Cluster:
    def __init__(self) -> None:
        self.boot = [free_port(), free_port()]
        self.prefill_argv = [
            worker_argv(
                port=free_port(),
                mode="prefill",
                bootstrap_port=self.boot[0],
                model=MODEL,
                extra=kv_events(free_port()),
            ),
            worker_argv(
                port=free_port(),
                mode="prefill",
                bootstrap_port=self.boot[1],
                model=MODEL,
                extra=[*kv_events(free_port()), "--dp-size", "2", "--base-gpu-id", "1"],
            ),
        ]
        self.prefills = [SimProcess(argv, env=SIM_ENV) for argv in self.prefill_argv]
        decode_argv = worker_argv(
            port=free_port(), mode="decode", model=MODEL, extra=["--base-gpu-id", "3"]
        )
        self.decode = SimProcess(decode_argv, env=SIM_ENV)
        self.lb: LoadBalancer | None = None
        self.runner: web.ServerRunner | None = None
        self.url = ""

    async def start(self) -> None:
        for sim in (*self.prefills, self.decode):
            sim.start()
        config = parse_args(
            [
                "--prefill",
                self.prefills[0].url,
                str(self.boot[0]),
                "--prefill",
                self.prefills[1].url,
                str(self.boot[1]),
                "--decode",
                self.decode.url,
                "--prefill-policy",
                "cache_aware",
                *FAST_HEALTH,
            ]
        )
        self.lb = LoadBalancer(config)
        await self.lb.start()
        self.runner = web.ServerRunner(self.lb.make_server())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        await self.wait_routable(2)

    async def wait_routable(self, prefills: int) -> None:
        assert self.lb is not None
        deadline = time.monotonic() + 60
        while len(self.lb.pool.routable("prefill")) < prefills or not self.lb.readiness_report()[0]:
            assert time.monotonic() < deadline, self.lb.readiness_report()[1]
            for sim in (*self.prefills, self.decode):
                assert sim.proc is not None and sim.proc.poll() is None, sim.log()[-3000:]
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.lb is not None:
            await self.lb.close()
        for sim in (*self.prefills, self.decode):
            sim.stop()


async def generate(session: aiohttp.ClientSession, url: str, text: str) -> dict[str, str]:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
    async with session.post(url + "/generate", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return dict(response.headers)


async def settled(lb: LoadBalancer, url: str, predicted_at_least: int, text: str) -> None:
    """Wait until the index of `url` has the prompt's blocks (events arrive after the answer)."""
    assert lb.cache_aware is not None
    deadline = time.monotonic() + 30  # seconds under a loaded suite; a quiet machine: ms
    while True:
        cache = lb.kv_index.workers.get(url) if lb.kv_index else None
        if cache is not None and cache.live and cache.sim_vocab:
            ids = encode(text, cache.sim_vocab)
            cached = lb.cache_aware.index.predict(cache, ids, pending=False)
            if max(cached) >= predicted_at_least:
                return
        assert time.monotonic() < deadline, f"{url}'s events never showed the prompt"
        await asyncio.sleep(0.02)


SYSTEM = "You are a careful assistant. " * 40  # ~1200 bytes: ~300 tokens, 18 whole pages


def test_requests_sharing_a_prefix_land_on_the_prefill_rank_that_cached_it():
    async def scenario() -> None:
        cluster = Cluster()
        try:
            await cluster.start()
            lb = cluster.lb
            assert lb is not None
            async with aiohttp.ClientSession() as session:
                groups = [f"Document {g}: " + SYSTEM for g in range(4)]
                first = {}
                for g, prefix in enumerate(groups):
                    headers = await generate(session, cluster.url, prefix + "Question 0?")
                    first[g] = (headers["X-PDKit-Prefill"], headers.get("X-PDKit-Prefill-DP-Rank"))
                    await settled(lb, first[g][0], 256, prefix)
                for g, prefix in enumerate(groups):
                    for q in range(1, 4):
                        headers = await generate(session, cluster.url, prefix + f"Question {q}?")
                        where = (headers["X-PDKit-Prefill"], headers.get("X-PDKit-Prefill-DP-Rank"))
                        assert where[0] == first[g][0]
                        if first[g][1] is not None:
                            assert where[1] == first[g][1]
                        assert int(headers["X-PDKit-Cached-Predicted"]) >= 256
            # The prefills' own counts agree with every prediction the router made.
            caches = lb.kv_index.workers.values() if lb.kv_index else []
            assert sum(c.predictions for c in caches) >= 12
            assert all(c.agreed == c.predictions for c in caches)
        finally:
            await cluster.stop()

    run(scenario(), timeout=120)


async def gone(pgid: int, timeout_s: float = 15) -> None:
    """Until no process of the group `pgid` is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process group {pgid} outlived its SIGKILL"
        await asyncio.sleep(0.05)


def test_a_restarted_prefill_is_never_routed_on_what_it_had_cached():
    async def scenario() -> None:
        cluster = Cluster()
        try:
            await cluster.start()
            lb = cluster.lb
            assert lb is not None and lb.kv_index is not None
            async with aiohttp.ClientSession() as session:
                prefix = "Shared context. " * 80
                headers = await generate(session, cluster.url, prefix + "A?")
                url = headers["X-PDKit-Prefill"]
                await settled(lb, url, 256, prefix)
                victim = next(i for i, p in enumerate(cluster.prefills) if p.url == url)
                # The worker dies and comes back empty, on the same ports.
                cluster.prefills[victim].kill()
                cluster.prefills[victim].proc.wait()  # type: ignore[union-attr]
                # Its rank processes hold the ports too: the new worker binds them once the
                # whole process group is gone (it once started first and exited).
                await gone(cluster.prefills[victim].proc.pid)  # type: ignore[union-attr]
                fresh = SimProcess(cluster.prefill_argv[victim], env=SIM_ENV).start()
                cluster.prefills[victim] = fresh
                deadline = time.monotonic() + 30
                while lb.kv_index.workers.get(url) is not None and (
                    lb.kv_index.workers[url].size() > 0
                ):
                    assert time.monotonic() < deadline, "the dead worker's entries stayed"
                    await asyncio.sleep(0.02)
                await cluster.wait_routable(2)
                # Asked now, the router expects nothing of the prefix on the fresh worker.
                assert lb.cache_aware is not None
                pd = parse_request("/generate", json.dumps({"text": prefix + "B?"}).encode())
                for worker in lb.pool.routable("prefill"):
                    choice = lb.cache_aware.plan([worker], pd, None)
                    if worker.url == url:
                        assert choice.predicted <= 0
                # Requests after the restart (the first may fail over: the decode still holds
                # the old process's transfer session) are predicted as the workers confirm.
                for q in range(4):
                    await generate(session, cluster.url, prefix + f"B{q}?")
            caches = lb.kv_index.workers.values()
            assert sum(c.predictions for c in caches) > 0
            assert all(c.agreed == c.predictions for c in caches)
        finally:
            await cluster.stop()

    run(scenario(), timeout=120)
