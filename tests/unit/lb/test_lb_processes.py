"""Several router processes on one port (--processes, router.processes): the limits that count
requests at once stay the limit (split), admission sees the load the workers report, one
scrape of /metrics answers for every process, /readiness lists them."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kit.lb.config import parse_args
from kit.lb.limits import SharedBuckets, SharedTokenBucket
from kit.lb.processes import merge_metrics, pid_running, process_config, share
from kit.topology.router_options import DEFAULTS, option_problems
from tests.support.fake_worker import FakeWorker, Ledger
from tests.support.lb_cluster import FAST_HEALTH, run, sse_events
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]


def test_shares_add_up_to_the_limit_and_seeds_differ():
    assert [share(5, 2, i) for i in range(2)] == [3, 2]
    assert sum(share(7, 3, i) for i in range(3)) == 7
    config = parse_args(
        [
            *("--prefill", "http://a:1", "--decode", "http://b:2", "--processes", "2"),
            *("--prefill-max-inflight", "3", "--hold-max", "10", "--seed", "7"),
        ],
        {},
    )
    first, second = (process_config(config, i) for i in range(2))
    assert (first.prefill_max_inflight, second.prefill_max_inflight) == (2, 1)
    assert (first.hold_max, second.hold_max) == (5, 5)
    assert first.seed != second.seed
    unlimited = process_config(replace(config, prefill_max_inflight=0), 1)
    assert unlimited.prefill_max_inflight == 0  # 0 stays "no limit"


def test_a_limit_smaller_than_the_processes_is_refused():
    (problem,) = option_problems(replace(DEFAULTS, processes=4, prefill_max_inflight=2))
    assert "--prefill-max-inflight 2 cannot be split over --processes 4" in problem


def test_one_scrape_labels_every_sample_with_its_process_and_says_who_answered():
    text = (
        "# HELP pdkit_lb_requests_total Client requests\n"
        "# TYPE pdkit_lb_requests_total counter\n"
        'pdkit_lb_requests_total{route="/generate",status="200"} 3.0\n'
    )
    merged = merge_metrics({0: text, 1: text.replace("3.0", "4.0"), 2: None}).decode()
    assert merged.count("# TYPE pdkit_lb_requests_total counter") == 1
    assert 'pdkit_lb_requests_total{process="0",route="/generate",status="200"} 3.0' in merged
    assert 'pdkit_lb_requests_total{process="1",route="/generate",status="200"} 4.0' in merged
    assert 'pdkit_lb_process_up{process="2"} 0.0' in merged


class QueuedPrefill(FakeWorker):
    """A prefill that says other requests' tokens wait on it (as SGLang's /v1/loads does)."""

    waiting_tokens = 5000

    def _loads(self, request: Any, reply: Any) -> None:
        reply.json(
            200,
            {
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": self.inflight,
                        "num_waiting_reqs": 1,
                        "num_waiting_uncached_tokens": self.waiting_tokens,
                    }
                ]
            },
        )


@contextlib.asynccontextmanager
async def router_processes(
    args: list[str], *, prefill_class: type[FakeWorker] = FakeWorker
) -> AsyncIterator[tuple[str, FakeWorker, FakeWorker, asyncio.subprocess.Process]]:
    """`python -m kit.lb --processes 2 ARGS` in front of one fake prefill and decode (the URL,
    the workers, the supervisor's process)."""
    ledger = Ledger()
    prefill = prefill_class("prefill", ledger, bootstrap_port=9000)
    decode = FakeWorker("decode", ledger)
    for worker in (prefill, decode):
        await worker.start()
    port = free_port()
    argv = [sys.executable, "-m", "kit.lb", "--prefill", prefill.url, "9000"]
    argv += ["--decode", decode.url, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--processes", "2", "--no-access-log", "--log-level", "warning", *FAST_HEALTH, *args]
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 20
            while True:
                assert proc.returncode is None, "the router exited"
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/readiness") as resp:
                        body = await resp.json()
                        if resp.status == 200 and all(p["running"] for p in body["processes"]):
                            break
                assert time.monotonic() < deadline, "the router is not ready"
                await asyncio.sleep(0.1)
        yield url, prefill, decode, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 15)
        for worker in (prefill, decode):
            await worker.stop()
    assert proc.returncode == 0


async def post_each_on_its_own_connection(url: str, n: int) -> list[tuple[int, float]]:
    """`n` requests at once, each on a new connection (the kernel spreads connections over
    the processes): (status, seconds) each."""

    async def one(i: int) -> tuple[int, float]:
        started = time.monotonic()
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(url + "/generate", json={"text": f"q{i}"}) as resp,
        ):
            await resp.read()
            return resp.status, time.monotonic() - started

    return await asyncio.gather(*(one(i) for i in range(n)))


def samples(text: str, name: str) -> dict[str, float]:
    """process -> the sum of `name`'s samples of that process."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{name}\{{process="(\d+)"[^}}]*\}} (\S+)', line)
        if match:
            out[match[1]] = out.get(match[1], 0.0) + float(match[2])
    return out


def test_two_processes_keep_the_prefill_limit_and_answer_for_each_other():
    async def scenario():
        async with router_processes(["--prefill-max-inflight", "2"]) as (url, prefill, _, _):
            prefill.latency = 0.4
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, prefill.inflight)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            answers = await post_each_on_its_own_connection(url, 12)
            watcher.cancel()
            assert [s for s, _ in answers] == [200] * 12
            assert peak == 2  # one per process: the limit of 2, not 2 per process
            async with aiohttp.ClientSession() as session:
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
                async with session.get(url + "/readiness") as resp:
                    ready = await resp.json()
            served = samples(text, "pdkit_lb_requests_total")
            assert set(served) == {"0", "1"} and sum(served.values()) >= 12
            assert len({p["pid"] for p in ready["processes"]}) == 2
            assert os.getpid() not in {p["pid"] for p in ready["processes"]}

    run(scenario(), timeout=60)


def test_two_processes_hold_no_more_than_the_hold_max_together():
    async def scenario():
        args = ["--hold-max", "2", "--hold-timeout", "1.5"]
        async with router_processes(args) as (url, _, decode, _):
            decode.health_status = 503
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 10
                while True:  # both processes have ejected it
                    async with session.get(url + "/metrics") as resp:
                        text = await resp.text()
                    healthy = [
                        line
                        for line in text.splitlines()
                        if line.startswith("pdkit_lb_worker_healthy{") and 'role="decode"' in line
                    ]
                    if len(healthy) == 2 and all(line.endswith(" 0.0") for line in healthy):
                        break
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            answers = await post_each_on_its_own_connection(url, 8)
            assert {s for s, _ in answers} == {503}
            held = [t for _, t in answers if t > 1.0]
            assert 1 <= len(held) <= 2  # the hold's limit is the router's, not each process's

    run(scenario(), timeout=60)


def test_each_process_s_admission_sees_the_queue_the_prefill_reports():
    async def scenario():
        args = ["--admission", "--admission-poll", "0.1"]
        async with (
            router_processes(args, prefill_class=QueuedPrefill) as (url, _, _, _),
            aiohttp.ClientSession() as session,
        ):
            deadline = time.monotonic() + 10
            while True:
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
                queued = samples(text, "pdkit_lb_admission_prefill_queue_tokens")
                if set(queued) == {"0", "1"} and min(queued.values()) >= 5000:
                    break
                assert time.monotonic() < deadline, queued
                await asyncio.sleep(0.1)

    run(scenario(), timeout=60)


def test_buckets_in_shared_memory_are_one_bucket_for_every_process():
    now = [10.0]
    store = SharedBuckets(2)
    first = SharedTokenBucket(2.0, 2.0, lambda: now[0], store, 0)
    second = SharedTokenBucket(2.0, 2.0, lambda: now[0], store, 0)  # another process's view
    assert first.take(1) == 0.0 and second.take(1) == 0.0
    assert first.take(1) == pytest.approx(0.5)  # empty for both
    now[0] += 0.5
    assert second.take(1) == 0.0  # half a second later: one more, for whichever asks
    assert first.take(1) == pytest.approx(0.5)


def test_a_client_on_one_connection_gets_its_whole_rate_from_two_processes():
    key = "sk-one-connection"
    limits = f"solo={hashlib.sha256(key.encode()).hexdigest()}:4:0:1"

    async def scenario():
        async with (
            router_processes(["--client-limits", limits]) as (url, _, _, _),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session,
        ):
            statuses = []
            for i in range(8):
                headers = {"Authorization": f"Bearer {key}"}
                async with session.post(
                    url + "/generate", json={"text": f"q{i}"}, headers=headers
                ) as resp:
                    await resp.read()
                    statuses.append(resp.status)
            # One connection reaches one process: with the rate split it would get 2 of 4.
            assert 4 <= statuses.count(200) <= 5 and statuses.count(429) >= 3

    run(scenario(), timeout=60)


async def process_pids(session: aiohttp.ClientSession, url: str) -> set[int]:
    async with session.get(url + "/readiness") as resp:
        return {p["pid"] for p in (await resp.json())["processes"]}


def test_sigusr2_starts_a_new_group_on_the_same_sockets_and_loses_no_request():
    """A group's handover: the new group listens before the old one stops accepting, so
    requests on fresh connections all succeed, a stream in flight finishes, the supervisor
    keeps its PID and the old processes exit."""

    async def scenario():
        async with router_processes([]) as (url, _, decode, proc):
            decode.token_delay = 0.02
            body = {"text": "x", "sampling_params": {"max_new_tokens": 4}}
            async with aiohttp.ClientSession() as session:
                before = await process_pids(session, url)
                stream = await session.post(
                    url + "/generate",
                    json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 60}},
                )
                first = await stream.content.readuntil(b"\n\n")
                fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

                async def one(i: int) -> int:
                    await asyncio.sleep(i * 0.02)
                    async with fresh.post(url + "/generate", json=body) as resp:
                        await resp.read()
                        return resp.status

                async with fresh:
                    load = asyncio.gather(*(one(i) for i in range(150)))  # 3 s of requests
                    await asyncio.sleep(0.3)
                    proc.send_signal(signal.SIGUSR2)
                    statuses = await load
                events = sse_events(first + await stream.read())
                deadline = time.monotonic() + 20
                while True:  # the new group is up and the old one gone
                    after = await process_pids(session, url)
                    if not after & before and not any(alive(pid) for pid in before):
                        break
                    assert time.monotonic() < deadline, (before, after)
                    await asyncio.sleep(0.1)
            assert events[-1] == b"[DONE]" and len(events) == 61
            assert statuses == [200] * 150, statuses
            assert proc.returncode is None and len(after) == 2

    run(scenario(), timeout=60)


def alive(pid: int) -> bool:
    return pid_running(pid)
