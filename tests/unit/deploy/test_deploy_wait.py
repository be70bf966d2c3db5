"""The readiness loop against real sockets: a worker that loads, then serves; one that never
answers; a node that follows its rank 0."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from kit.deploy.wait import Target, wait_ready


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
