"""The readiness loop against real sockets: a worker that loads, then serves; one that never
answers; a node that follows its rank 0."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

from aiohttp import web

from kit.deploy.wait import Target, wait_ready, worker_targets
from kit.hosts.context import load_context
from tests.conftest import base_topology


async def serve(health):
    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def test_waits_through_loading_until_every_worker_is_ready():
    async def scenario():
        started = time.monotonic()

        async def health(request):
            return web.Response(status=200 if time.monotonic() - started > 0.3 else 503)

        runner, url = await serve(health)
        targets = [
            Target("decode-0", "decode", "h", url, "/health"),
            Target("decode-0-node1", "decode", "h", None, "/health", rank0="decode-0"),
        ]
        seen: list[list[str]] = []
        try:
            return await wait_ready(
                targets,
                {},
                timeout=10,
                since=time.time(),
                interval=0.05,
                on_update=lambda s: seen.append([x.verdict.state for x in s]),
            ), seen
        finally:
            await runner.cleanup()

    statuses, seen = asyncio.run(scenario())
    assert [s.verdict.state for s in statuses] == ["ready", "ready"]
    assert seen[0] == ["starting", "starting"]
    assert statuses[1].verdict.detail == "rank 0 is ready"


def test_times_out_saying_what_it_last_saw():
    async def scenario():
        async def health(request):
            return web.Response(status=503)

        runner, url = await serve(health)
        try:
            return await wait_ready(
                [
                    Target("prefill-0", "prefill", "h", url, "/health"),
                    Target("decode-0", "decode", "h", "http://127.0.0.1:9", "/health"),
                ],
                {},
                timeout=0.3,
                since=time.time(),
                interval=0.05,
            )
        finally:
            await runner.cleanup()

    statuses = asyncio.run(scenario())
    assert [s.verdict.state for s in statuses] == ["timeout", "timeout"]
    assert "503" in statuses[0].verdict.detail
    assert "no answer" in statuses[1].verdict.detail


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show of pdkit's units: decode-0 in a crash loop stopped by its start limit.
cat <<'OUT'
Id=pdkit-t-decode-0.service
ActiveState=failed
SubState=failed
Result=start-limit-hit
NRestarts=4
ExecMainPID=0
ExecMainStatus=1
ExecMainStartTimestamp=@1764633600
ExecMainExitTimestamp=@1764633601

Id=pdkit-t-prefill-0.service
ActiveState=activating
SubState=start
Result=success
NRestarts=0
ExecMainPID=4242
ExecMainStatus=0
ExecMainStartTimestamp=@1764633600
ExecMainExitTimestamp=
OUT
"""


def test_a_systemd_crash_loop_fails_the_wait_at_the_first_poll(
    tmp_path, monkeypatch, write_topology
):
    """On a systemd host each poll reads `systemctl show` of the units (here a local host with
    a fake systemctl): a unit that hit its start limit fails the wait at once, named as a crash
    loop, instead of after the whole timeout."""
    tool = tmp_path / "bin" / "systemctl"
    tool.parent.mkdir()
    tool.write_text(FAKE_SYSTEMCTL)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    data = base_topology()
    data["hosts"] = [
        {
            "name": "h",
            "address": "127.0.0.1",
            "connection": "local",
            "gpus": 8,
            "service_manager": "systemd",
        }
    ]
    data["prefill"] = {"count": 1, "hosts": ["h"]}
    data["decode"] = {"count": 1, "hosts": ["h"]}
    data["transfer"] = {"backend": "mooncake_tcp"}
    data["router"] = {"host": "h"}
    ctx = load_context(write_topology(data))
    targets = [t for t in worker_targets(ctx.plan)]
    assert {t.unit for t in targets} == {"pdkit-t-prefill-0.service", "pdkit-t-decode-0.service"}
    closed = "http://127.0.0.1:9"
    targets = [replace(t, url=closed) for t in targets]
    rounds: list[int] = []
    statuses = asyncio.run(
        wait_ready(
            targets,
            ctx.hosts_by_name,
            timeout=600,
            since=time.time(),
            interval=0.05,
            on_update=lambda s: rounds.append(1),
        )
    )
    by_name = {s.target.name: s.verdict for s in statuses}
    assert by_name["decode-0"].state == "failed"
    assert "crash loop" in by_name["decode-0"].detail
    assert "systemd failed/failed" in by_name["decode-0"].detail
    assert by_name["prefill-0"].state == "starting"
    assert "pid 4242" in by_name["prefill-0"].detail
    assert len(rounds) == 1
