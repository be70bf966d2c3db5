"""Retries before the first byte, outlier ejection and the hold, through a real load balancer."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from tests.support.fake_worker import FakeWorker
from tests.support.lb_cluster import run, running_cluster, sse_events

RR = ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]


def _metric(metrics: bytes, line: str) -> bool:
    return line.encode() in metrics


def test_a_prefill_answering_5xx_is_sent_again_on_the_other_pair_with_a_new_room():
    async def scenario():
        async with running_cluster(2, 1, args=RR) as c:
            c.prefill[0].fail_status = 503
            for _ in range(4):
                status, body, headers = await c.post("/generate", {"text": "x"})
                assert status == 200, body
                assert headers["X-PDKit-Prefill"] == c.prefill[1].url
            rooms = [b["bootstrap_room"] for _, b in c.prefill[0].requests]
            retried = [b["bootstrap_room"] for _, b in c.prefill[1].requests]
            assert rooms and not set(rooms) & set(retried)  # every attempt has a fresh room
            _, metrics, _ = await c.get("/metrics")
            assert _metric(metrics, 'pdkit_lb_retries_total{role="prefill"}')

    run(scenario())


def test_a_4xx_the_worker_meant_is_passed_on_and_not_retried():
    async def scenario():
        async with running_cluster(2, 1, args=RR) as c:
            for worker in c.prefill:
                worker.fail_status = 400
            status, _, _ = await c.post("/generate", {"text": "x"})
            assert status == 400
            assert sum(len(w.requests) for w in c.prefill) == 1
            assert all(w.routable for w in c.lb.pool)
            _, metrics, _ = await c.get("/metrics")
            assert not _metric(metrics, "pdkit_lb_retries_total{")

    run(scenario())


def test_a_decode_answering_5xx_is_retried_and_blamed():
    async def scenario():
        async with running_cluster(1, 2, args=RR) as c:
            c.decode[0].fail_status = 500
            for path, body in (
                ("/generate", {"text": "x"}),
                ("/v1/completions", {"prompt": "x", "stream": True}),
            ):
                status, _, headers = await c.post(path, body)
                assert status == 200 and headers["X-PDKit-Decode"] == c.decode[1].url
            assert c.lb.pool.get(c.decode[0].url).failures >= 1

    run(scenario())


def test_a_decode_refusing_with_503_while_its_prefill_runs_is_blamed_and_left_out():
    """A decode's 503 is its own refusal (SGLang: starting, shutting down, no KV to reclaim),
    even while the prefill leg still runs (a prefill lost is a 500): the retry leaves that
    decode out, and the failures count against it, not against the prefill, until it is
    ejected (for a moment here: its /health still passes). Blamed on the prefill, the
    retries went back to the refusing decode, which least_inflight favours (it holds
    nothing): a request failed with decode-1 up."""

    async def scenario():
        async with running_cluster(1, 2, args=["--decode-policy", "least_inflight"]) as c:
            c.prefill[0].latency = 0.2  # the prefill leg runs when the decode answers
            c.decode[0].fail_status = 503
            refusing = c.lb.pool.get(c.decode[0].url)
            for _ in range(6):
                status, body, headers = await c.post("/generate", {"text": "x"})
                assert status == 200, body
                assert headers["X-PDKit-Decode"] == c.decode[1].url
            assert c.lb.pool.get(c.prefill[0].url).failures == 0
            assert refusing.ejections.get("failures", 0) >= 1

    run(scenario())


def test_consecutive_failures_eject_a_worker_but_never_the_last_of_its_role():
    async def scenario():
        async with running_cluster(
            2,
            1,
            args=[
                *RR,
                "--eject-after-failed-requests",
                "2",
                "--eject-backoff",
                "5",
                "--eject-backoff-max",
                "5",
            ],
        ) as c:
            sick = c.lb.pool.get(c.prefill[0].url)
            c.prefill[0].fail_status = 500
            for _ in range(4):
                status, _, _ = await c.post("/generate", {"text": "x"})
                assert status == 200
            assert not sick.routable and sick.reason_kind == "failures"
            assert "2 requests failed in a row" in sick.reason
            # the other prefill fails too: it is the last one, so it stays in
            c.prefill[1].fail_status = 500
            for _ in range(3):
                status, _, _ = await c.post("/generate", {"text": "x"})
                assert status == 500
            assert c.lb.pool.get(c.prefill[1].url).routable

    run(scenario())


def test_a_stream_whose_decode_sends_no_first_token_is_sent_again_elsewhere():
    async def scenario():
        async with running_cluster(1, 2, args=[*RR, "--first-token-timeout", "0.3"]) as c:
            c.decode[0].hang = True
            status, raw, headers = await c.post(
                "/generate", {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 3}}
            )
            assert status == 200 and headers["X-PDKit-Decode"] == c.decode[1].url
            assert sse_events(raw)[-1] == b"[DONE]"
            await c.wait_for(lambda: c.decode[0].cancelled, what="the hung leg cancelled")

    run(scenario())


def test_a_stream_whose_first_event_is_an_error_is_sent_again():
    async def scenario():
        async with running_cluster(1, 2, args=RR) as c:
            first = c.decode[0]
            original = first._answer

            def error_event(shapes, reply):  # SGLang: 200, then the failure as an event
                reply.start_stream()
                reply.end_stream(
                    b'data: {"error": {"message": "KV transfer failed", "code": 500}}\n\n'
                )

            first._answer = error_event
            status, raw, headers = await c.post("/v1/completions", {"prompt": "x", "stream": True})
            first._answer = original
            assert status == 200 and headers["X-PDKit-Decode"] == c.decode[1].url
            assert b"error" not in raw

    run(scenario())


def test_a_client_that_goes_away_is_not_retried():
    async def scenario():
        async with running_cluster(2, 2) as c:
            for worker in (*c.prefill, *c.decode):
                worker.hang = True
            with contextlib.suppress(TimeoutError):
                await c.session.post(
                    c.url + "/generate",
                    json={"text": "x"},
                    timeout=aiohttp.ClientTimeout(total=0.2),
                )
            await c.wait_for(lambda: c.lb.inflight == 0, what="request finished")
            assert sum(len(w.requests) for w in c.prefill) == 1

    run(scenario())


def test_a_request_is_held_while_the_only_decode_restarts():
    async def scenario():
        async with running_cluster(1, 1, args=["--hold-timeout", "3"]) as c:
            dead = c.decode[0]
            await dead.stop()
            back = FakeWorker("decode", c.ledger, port=dead.port)

            async def restart():
                await asyncio.sleep(0.4)
                await back.start()

            try:
                restarting = asyncio.create_task(restart())
                status, body, _ = await c.post("/generate", {"text": "x"})
                await restarting
                assert status == 200, body
                _, metrics, _ = await c.get("/metrics")
                assert _metric(metrics, 'pdkit_lb_held_total{role="decode"} 1.0')
                assert _metric(metrics, "pdkit_lb_held_requests 0.0")
            finally:
                await back.stop()

    run(scenario())


def test_a_hold_ends_in_a_503_with_retry_after_and_is_bounded():
    async def scenario():
        async with running_cluster(
            1,
            1,
            args=[
                "--hold-timeout",
                "0.5",
                "--hold-max",
                "1",
                "--eject-backoff",
                "3",
                "--eject-backoff-max",
                "3",
            ],
        ) as c:
            await c.decode[0].stop()
            held = asyncio.create_task(c.post("/generate", {"text": "x"}))
            await c.wait_for(lambda: c.lb.metrics.held == 1, what="one request held")
            status, body, _ = await c.post("/generate", {"text": "y"})
            assert status == 503 and "--hold-max" in body["error"]["message"]
            status, body, headers = await held
            assert status == 503 and "--hold-timeout" in body["error"]["message"]
            assert body["error"]["type"] == "service_unavailable"
            assert int(headers["Retry-After"]) >= 1

    run(scenario())
