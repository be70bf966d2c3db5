"""--prefill-max-inflight: requests beyond a prefill's limit wait in the router, oldest first,
and go to the first prefill with room (late binding), not into a busy prefill's own queue."""

from __future__ import annotations

import asyncio

from tests.support.lb_cluster import run, running_cluster


def test_a_full_prefill_s_work_waits_in_the_router_and_goes_to_the_prefill_that_frees():
    async def scenario():
        args = ["--prefill-max-inflight", "1", "--prefill-policy", "round_robin"]
        async with running_cluster(2, 1, args=args) as c:
            slow, fast = c.prefill
            slow.latency, fast.latency = 1.5, 0.05
            peak = {slow.url: 0, fast.url: 0}
            queued_seen = []

            async def watch() -> None:
                while True:
                    for w in (slow, fast):
                        peak[w.url] = max(peak[w.url], w.inflight)
                    queued_seen.append(c.lb.metrics.queued)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            answers = await asyncio.gather(
                *(c.post("/generate", {"text": f"q{i}"}) for i in range(8))
            )
            watcher.cancel()
            assert all(status == 200 for status, _, _ in answers)
            # Never more than the limit out on a prefill; the rest waited in the router ...
            assert peak == {slow.url: 1, fast.url: 1}
            assert max(queued_seen) >= 5
            # ... and the fast prefill took them as it freed: round robin alone would have
            # queued half of them behind the slow one.
            served = {w.url: len(w.requests) for w in (slow, fast)}
            assert served[slow.url] <= 2 and served[fast.url] >= 6
            _, raw, _ = await c.get("/metrics")
            assert "pdkit_lb_queued_requests 0.0" in raw.decode()

    run(scenario())


def test_without_a_limit_every_request_goes_to_a_prefill_at_once():
    async def scenario():
        async with running_cluster(1, 1) as c:
            (prefill,) = c.prefill
            prefill.latency = 0.3
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, prefill.inflight)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            answers = await asyncio.gather(
                *(c.post("/generate", {"text": f"q{i}"}) for i in range(5))
            )
            watcher.cancel()
            assert all(status == 200 for status, _, _ in answers)
            assert peak == 5 and c.lb.metrics.queued == 0

    run(scenario())
