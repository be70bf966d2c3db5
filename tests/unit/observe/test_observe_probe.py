"""The probing loop over real sockets: answers, refusals, silence, and a round's bound."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace

import pytest
from aiohttp import web

from kit.errors import ProbeError
from kit.observe.probe import Prober
from kit.observe.targets import RouterTarget, Targets
from kit.observe.worker import evaluate_worker
from kit.topology.schema import SLO
from tests.support.observe_builders import worker_target
from tests.support.ports import free_port


@contextlib.asynccontextmanager
async def serving(routes: dict[str, web.StreamResponse | str | int]):
    """A server answering each path with a status (int), a body (str), or never (...)."""
    hits: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        hits.append(request.path_qs)
        answer = routes.get(request.path, 404)
        if answer is Ellipsis:
            await asyncio.Event().wait()
        if isinstance(answer, int):
            return web.Response(status=answer)
        return web.Response(text=str(answer))

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


def test_an_answer_a_refusal_and_silence_are_told_apart():
    async def scenario():
        async with (
            serving({"/health": 200, "/slow": ..., "/starting": 503}) as (url, _),
            Prober(timeout=0.3) as prober,
        ):
            answered = await prober.get(f"{url}/health")
            assert answered.ok and answered.failure is None and answered.at > 0
            assert (await prober.get(f"{url}/starting")).status == 503
            silent = await prober.get(f"{url}/slow")
            assert silent.failure == "timeout" and silent.detail == "no answer within 0.3 s"
            assert 0.25 < silent.seconds < 2
            refused = await prober.get(f"http://127.0.0.1:{free_port()}/health")
            assert refused.failure == "refused" and refused.detail == "connection refused"

    asyncio.run(scenario())


def test_a_silent_worker_costs_one_timeout_and_its_other_requests_are_skipped():
    async def scenario():
        async with (
            serving({"/health": 200, "/server_info": "{}", "/metrics": ""}) as (good, hits),
            serving({p: ... for p in ("/health", "/server_info", "/v1/loads", "/metrics")}) as (
                silent,
                silent_hits,
            ),
            serving({"/health": 200, "/readiness": "{}", "/metrics": "x 1\n"}) as (router, _),
        ):
            targets = Targets(
                "t",
                (
                    worker_target("prefill", url=silent),
                    *(worker_target("decode", url=good, instance=i) for i in range(20)),
                ),
                RouterTarget("router", "pdkit", "h", router, f"{router}/metrics", None),
                SLO(),
            )
            async with Prober(timeout=0.5, concurrency=4) as prober:
                started = time.monotonic()
                round_ = await prober.round(targets, rate_window_s=0.2)
                elapsed = time.monotonic() - started
            first = round_.workers[0]
            assert first.health.failure == "timeout"
            # called off when /health fails; ones already sent may time out in the same loop
            # turn on a loaded machine (both timers are ~0.5 s): either way, no answer counted
            others = {f.failure for f in (first.server_info, first.loads, first.metrics)}
            assert others <= {"skipped", "timeout"}
            assert silent_hits[0] == "/health"
            assert all(w.health.ok for w in round_.workers[1:])
            assert len([h for h in hits if h == "/health"]) == 20
            # bounded by the probe timeout, not 21 of them (generous: a shared machine)
            assert elapsed < 0.5 * 4
            # two scrapes of the router's metrics, at least the rate window apart
            assert round_.router_metrics_before is not None
            assert round_.router.metrics.at - round_.router_metrics_before.at >= 0.2

    asyncio.run(scenario())


@pytest.mark.parametrize(("timeout", "concurrency"), [(0.0, 1), (1.0, 0)])
def test_nonsense_options_are_refused(timeout, concurrency):
    with pytest.raises(ProbeError):
        Prober(timeout=timeout, concurrency=concurrency)


def test_using_a_prober_outside_its_context_is_an_error():
    with pytest.raises(ProbeError, match="async with"):
        asyncio.run(Prober().get("http://127.0.0.1:1/"))


def test_the_load_figures_are_read_after_health_so_the_probe_does_not_count_itself():
    """SGLang's /health is a one-token generation: an idle worker read while it runs says
    running 1. The prober asks /v1/loads and /metrics only once /health has answered."""
    from kit.observe.worker import evaluate_worker  # noqa: PLC0415

    async def scenario():
        running = 0

        async def health(request: web.Request) -> web.Response:
            nonlocal running
            running += 1  # the health check's own generation
            await asyncio.sleep(0.2)
            running -= 1
            return web.Response(text="")

        async def loads(request: web.Request) -> web.Response:
            return web.json_response({"loads": [{"num_running_reqs": running}]})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/loads", loads)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with Prober(timeout=2.0) as prober:
                (answers,) = await prober.workers([worker_target("prefill", url=url)])
        finally:
            await runner.cleanup()
        return evaluate_worker(answers, time.time())

    status = asyncio.run(scenario())
    assert status.running == 0


def test_another_node_of_an_instance_is_asked_health_and_metrics_only():
    """SGLang's node ranks >= 1 serve /health and /metrics on their port (its dummy health
    server): status asks those two, and a healthy follower is healthy without /server_info."""

    async def scenario():
        async with (
            serving({"/health": 200, "/metrics": ""}) as (url, hits),
            Prober(timeout=2) as prober,
        ):
            target = replace(
                worker_target("decode", url), name="decode-0-node1", node_rank=1, nnodes=2
            )
            [answers] = await prober.workers([target])
            return answers, hits

    answers, hits = asyncio.run(scenario())
    assert sorted(hits) == ["/health", "/metrics"]
    status = evaluate_worker(answers, time.time())
    assert (status.state, status.problems, status.node_rank) == ("healthy", (), 1)
    assert answers.server_info.detail == "not asked: node rank 1 serves no /server_info"
