"""`python -m kit.lb` as a process: it serves, drains on SIGTERM, and exits with a clear status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time

import aiohttp

from tests.conftest import REPO
from tests.support.fake_worker import FakeWorker, Ledger
from tests.support.lb_cluster import run, sse_events
from tests.support.ports import free_port


class LbProcess:
    """The load balancer in a subprocess, in front of fake workers in this process."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.ledger = Ledger()
        self.prefill = FakeWorker("prefill", self.ledger, bootstrap_port=8998)
        self.decode = FakeWorker("decode", self.ledger)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> LbProcess:
        await self.prefill.start()
        await self.decode.start()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kit.lb",
            "--prefill",
            self.prefill.url,
            "8998",
            "--decode",
            self.decode.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--drain-grace",
            str(self.grace),
            "--health-interval",
            "0.05",
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + "/readiness") as resp:
                        if resp.status == 200:
                            return self
                if time.monotonic() > deadline or self.proc.returncode is not None:
                    raise AssertionError(await self.output())
                await asyncio.sleep(0.05)

    async def output(self) -> str:
        if self.proc is None or self.proc.stdout is None:
            return ""
        if self.proc.returncode is None:
            self.proc.kill()
        return (await self.proc.stdout.read()).decode()

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self.prefill.stop()
        await self.decode.stop()
        assert not self.ledger.problems, self.ledger.problems


async def refused(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as resp:
            await resp.read()
            return False
    except aiohttp.ClientConnectorError:
        return True


def test_sigterm_lets_a_stream_finish_refuses_new_connections_and_exits_0():
    async def scenario():
        async with LbProcess(grace=10) as lb:
            lb.decode.token_delay = 0.05
            async with aiohttp.ClientSession() as session:
                resp = await session.post(
                    lb.url + "/generate",
                    json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 20}},
                )
                first = await resp.content.readuntil(b"\n\n")
                lb.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 3
                while not await refused(lb.url):
                    assert time.monotonic() < deadline, "still accepting after SIGTERM"
                    await asyncio.sleep(0.02)
                rest = await resp.read()
            events = sse_events(first + rest)
            assert len(events) == 21 and events[-1] == b"[DONE]"
            assert events[-2]["text"].endswith(" t19")
            code = await asyncio.wait_for(lb.proc.wait(), 5)
            log = await lb.output()
            assert code == 0, log
            assert "draining: 1 requests in flight" in log and "stopped" in log
            # the access line of the stream, written (in its batch) before the process ended
            (line,) = [x for x in log.splitlines() if x.startswith("access {")]
            entry = json.loads(line.removeprefix("access "))
            assert (entry["status"], entry["stream"], entry["tokens"]) == (200, True, 20)

    run(scenario(), timeout=40)


def test_sigterm_cuts_streams_that_outlive_the_grace_period():
    async def scenario():
        async with LbProcess(grace=0.5) as lb:
            lb.decode.token_delay = 0.05
            async with aiohttp.ClientSession() as session:
                resp = await session.post(
                    lb.url + "/generate",
                    json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 400}},
                )
                await resp.content.readuntil(b"\n\n")
                started = time.monotonic()
                lb.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    await resp.read()
            code = await asyncio.wait_for(lb.proc.wait(), 5)
            assert code == 0
            assert time.monotonic() - started < 3
            await asyncio.sleep(0.2)
            assert lb.decode.cancelled == ["/generate"]

    run(scenario(), timeout=40)


def test_help_bad_arguments_and_a_taken_port():
    def lb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kit.lb", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    shown = lb("--help")
    assert shown.returncode == 0 and "examples:" in shown.stdout
    bad = lb("--decode", "http://127.0.0.1:1")
    assert bad.returncode == 2 and "at least one --prefill" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = lb(
            "--prefill",
            "http://127.0.0.1:1",
            "--decode",
            "http://127.0.0.1:2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        )
    assert busy.returncode == 1 and "cannot listen on" in busy.stderr
    assert "Traceback" not in busy.stderr


def test_sigusr2_hands_the_socket_to_a_new_image_and_loses_no_request():
    """SIGUSR2: the stream in flight finishes, requests sent meanwhile on new connections all
    succeed, and the same PID serves from a new image (/health's `started`). Not covered: a
    request written on a kept-alive connection just as the old image closes it idle gets a
    disconnect (the usual keep-alive race; a linger with `Connection: close` would narrow it)."""

    async def scenario():
        async with LbProcess(grace=10) as lb:
            lb.decode.token_delay = 0.02
            body = {"text": "x", "sampling_params": {"max_new_tokens": 4}}
            async with aiohttp.ClientSession() as session:
                async with session.get(lb.url + "/health") as resp:
                    before = (await resp.json())["started"]
                stream = await session.post(
                    lb.url + "/generate",
                    json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 40}},
                )
                first = await stream.content.readuntil(b"\n\n")

                fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

                async def one(i: int) -> int:
                    await asyncio.sleep(i * 0.03)
                    async with fresh.post(lb.url + "/generate", json=body) as resp:
                        await resp.read()
                        return resp.status

                async with fresh:
                    load = asyncio.gather(*(one(i) for i in range(100)))  # 3 s of requests
                    await asyncio.sleep(0.3)
                    lb.proc.send_signal(signal.SIGUSR2)
                    statuses = await load
                events = sse_events(first + await stream.read())
            # A new connection: the stream's, kept alive, is closed by the old image once the
            # stream ends (the keep-alive race of the docstring, not what this test is about).
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as new,
                new.get(lb.url + "/health") as resp,
            ):
                after = await resp.json()
            assert events[-1] == b"[DONE]" and len(events) == 41
            assert statuses == [200] * 100, statuses
            assert after["status"] == "ok" and after["started"] > before
            assert lb.proc.returncode is None  # the same process, a new image
            lb.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(lb.proc.wait(), 10) == 0
            log = await lb.output()
            assert "handover: " in log and "handing the socket over: exec" in log, log

    run(scenario(), timeout=60)
