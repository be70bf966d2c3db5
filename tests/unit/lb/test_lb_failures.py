"""Failures through a real load balancer: failing legs, lost clients, ejection, timeouts."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from tests.support.lb_cluster import run, running_cluster, sse_events


def test_a_failing_prefill_fails_the_request_with_its_status_and_cancels_the_decode():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.prefill[0].fail_status = 400
            c.prefill[0].latency = 0.05
            status, body, _ = await c.post("/generate", {"text": "x"})
            assert status == 400 and body["message"] == "prefill failed on purpose"
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")
            assert c.lb.pool.get(c.decode[0].url).inflight == 0

    run(scenario())


def test_a_failing_decode_passes_its_status_on_and_cancels_the_prefill():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.decode[0].fail_status = 503
            c.prefill[0].latency = 5.0
            status, body, _ = await c.post("/v1/completions", {"prompt": "x"})
            assert status == 503 and body["message"] == "decode failed on purpose"
            await c.wait_for(lambda: c.prefill[0].cancelled, what="prefill leg cancelled")

    run(scenario())


def test_a_failing_prefill_during_a_stream_gives_a_clean_http_error():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.prefill[0].fail_status = 500
            c.prefill[0].latency = 0.05
            status, _, headers = await c.post("/generate", {"text": "x", "stream": True})
            assert status == 500 and headers["Content-Type"].startswith("application/json")
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")

    run(scenario())


def test_a_decode_dying_mid_stream_ends_the_stream_with_an_error_event():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.decode[0].die_after_tokens = 2
            status, raw, _ = await c.post(
                "/generate", {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 5}}
            )
            assert status == 200
            events = sse_events(raw)
            assert [e["text"] for e in events[:2]] == [" t0", " t0 t1"]
            assert events[2]["error"]["code"] == 502
            assert "decode worker" in events[2]["error"]["message"]
            assert events[3] == b"[DONE]"
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_errors_total{cause="decode_transport"} 1.0' in metrics

    run(scenario())


def test_a_client_that_goes_away_cancels_both_legs():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.prefill[0].hang = True
            c.decode[0].hang = True
            timeout = aiohttp.ClientTimeout(total=0.3)
            with contextlib.suppress(TimeoutError):
                await c.session.post(c.url + "/generate", json={"text": "x"}, timeout=timeout)
            await c.wait_for(
                lambda: c.prefill[0].cancelled and c.decode[0].cancelled, what="both legs cancelled"
            )
            await c.wait_for(lambda: all(w.inflight == 0 for w in c.lb.pool), what="no load")
            assert c.lb.inflight == 0
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_requests_total{route="/generate",status="499"} 1.0' in metrics

    run(scenario())


def test_a_streaming_client_that_goes_away_cancels_the_decode():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.decode[0].token_delay = 0.05
            resp = await c.session.post(
                c.url + "/generate",
                json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 200}},
            )
            await resp.content.readuntil(b"\n\n")
            resp.close()
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")
            await c.wait_for(lambda: c.lb.inflight == 0, what="request finished")

    run(scenario())


def test_a_client_that_reads_slowly_still_gets_the_whole_stream_in_order():
    async def scenario():
        async with running_cluster(1, 1) as c:
            tokens = 1500  # /generate events carry the text so far: megabytes in all
            resp = await c.session.post(
                c.url + "/generate",
                json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": tokens}},
            )
            await asyncio.sleep(0.3)  # not reading: the router's buffers to this client fill up
            raw = await resp.read()
            events = sse_events(raw)
            assert len(events) == tokens + 1 and events[-1] == b"[DONE]"
            assert events[-2]["text"].endswith(f" t{tokens - 1}")
            assert [e["text"].count(" t") for e in events[:-1]] == list(range(1, tokens + 1))

    run(scenario())


def test_an_unreachable_prefill_is_retried_on_another_and_ejected():
    async def scenario():
        async with running_cluster(
            2,
            1,
            args=[
                "--prefill-policy",
                "round_robin",
                "--eject-backoff",
                "30",
                "--eject-backoff-max",
                "30",
            ],
        ) as c:
            dead = c.prefill[0]
            await dead.stop()
            for _ in range(4):
                status, body, _ = await c.post("/generate", {"text": "x"})
                assert status == 200, body
            worker = c.lb.pool.get(dead.url)
            assert not worker.routable and "connection error" in worker.reason
            _, ready, _ = await c.get("/readiness")
            assert [o["url"] for o in ready["out"]] == [dead.url]
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_retries_total{role="prefill"} 1.0' in metrics
            out = f'reason="connection_error",role="prefill",worker="{dead.url}"'
            assert f"pdkit_lb_worker_out{{{out}}} 1.0".encode() in metrics

    run(scenario())


def test_an_unreachable_decode_is_retried_on_another():
    async def scenario():
        async with running_cluster(1, 2, args=["--decode-policy", "round_robin"]) as c:
            dead = c.decode[1]
            await dead.stop()
            for _ in range(3):
                status, body, _ = await c.post("/generate", {"text": "x", "stream": True})
                assert status == 200, body
            assert not c.lb.pool.get(dead.url).routable
            # the prefill leg of the failed attempt was cancelled, not left waiting
            await c.wait_for(lambda: all(w.inflight == 0 for w in c.lb.pool), what="no load")

    run(scenario())


def test_no_reachable_worker_is_a_503_with_the_reason_and_retry_after():
    async def scenario():
        async with running_cluster(
            1,
            1,
            args=["--eject-backoff", "30", "--eject-backoff-max", "30", "--hold-timeout", "0"],
        ) as c:
            await c.decode[0].stop()
            for _ in range(2):
                status, body, headers = await c.post("/generate", {"text": "x"})
                assert status == 503 and "no healthy decode worker" in body["error"]["message"]
                assert "connection error" in body["error"]["message"]
                assert body["error"]["type"] == "service_unavailable"
                assert int(headers["Retry-After"]) >= 1
            status, _, _ = await c.get("/readiness")
            assert status == 503

    run(scenario())


def test_a_worker_failing_health_checks_is_ejected_and_readmitted():
    async def scenario():
        async with running_cluster(2, 1) as c:
            sick = c.prefill[0]
            sick.health_status = 503
            worker = c.lb.pool.get(sick.url)
            await c.wait_for(lambda: not worker.routable, what="ejection")
            assert "health check failed 2 times" in worker.reason and "HTTP 503" in worker.reason
            _, ready, _ = await c.get("/readiness")
            assert ready["ready"] and ready["prefill"]["healthy"] == 1
            assert ready["out"][0]["reason"] == worker.reason
            before = len(sick.requests)
            for _ in range(4):
                status, _, _ = await c.post("/generate", {"text": "x"})
                assert status == 200
            assert len(sick.requests) == before
            _, metrics, _ = await c.get("/metrics")
            assert (
                f'pdkit_lb_worker_healthy{{role="prefill",worker="{sick.url}"}} 0.0'.encode()
                in metrics
            )
            sick.health_status = 200
            await c.wait_for(lambda: worker.routable, what="readmission")
            assert worker.ejections == {"health_check": 1}

    run(scenario())


def test_a_busy_worker_whose_health_answers_late_stays_in_while_it_finishes_requests():
    async def scenario():
        async with running_cluster(1, 1, args=["--health-timeout", "0.05"]) as c:
            busy = c.prefill[0]

            async def late(reply):
                await asyncio.sleep(0.2)  # SGLang's /health waits behind the running batch
                reply.text(200, "")

            busy._routes[("GET", "/health")] = lambda request, reply: late(reply)
            busy.latency = 0.1
            worker = c.lb.pool.get(busy.url)

            async def client():
                for _ in range(6):
                    status, _, _ = await c.post("/generate", {"text": "x"})
                    assert status == 200

            await asyncio.gather(client(), client())  # always a request in flight
            assert worker.routable and worker.probes_busy >= 2
            assert "not counted" in worker.last_probe_error
            # idle, the same late answers count: the worker is ejected
            await c.wait_for(lambda: not worker.routable, what="ejection once idle")
            assert "no answer within 0.05 s" in worker.reason

    run(scenario())


def test_a_prefill_that_takes_too_long_is_a_504():
    async def scenario():
        async with running_cluster(1, 1, args=["--prefill-timeout", "0.2"]) as c:
            c.prefill[0].hang = True
            status, body, _ = await c.post("/generate", {"text": "x"})
            assert status == 504 and "prefill worker" in body["error"]["message"]
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")

    run(scenario())


def test_a_stalled_stream_ends_with_a_timeout_event():
    async def scenario():
        async with running_cluster(1, 1, args=["--idle-timeout", "0.2", "--no-migrate"]) as c:
            c.decode[0].token_delay = 1.0
            status, raw, _ = await c.post("/generate", {"text": "x", "stream": True})
            events = sse_events(raw)
            assert status == 200 and events[0]["text"] == " t0"
            assert events[1]["error"]["code"] == 504 and events[2] == b"[DONE]"
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")

    run(scenario())


def test_a_stream_whose_decode_never_answers_is_a_504_before_anything_is_sent():
    async def scenario():
        async with running_cluster(1, 1, args=["--first-token-timeout", "0.2"]) as c:
            c.decode[0].hang = True
            status, body, _ = await c.post("/generate", {"text": "x", "stream": True})
            assert status == 504 and "--first-token-timeout" in body["error"]["message"]
            await c.wait_for(lambda: c.decode[0].cancelled, what="decode leg cancelled")

    run(scenario())


def test_the_whole_request_timeout_applies_to_streams_too():
    async def scenario():
        async with running_cluster(1, 1, args=["--request-timeout", "0.4"]) as c:
            c.decode[0].token_delay = 0.15
            status, raw, _ = await c.post(
                "/generate",
                {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 50}},
            )
            events = sse_events(raw)
            assert status == 200 and events[-2]["error"]["code"] == 504
            assert "--request-timeout" in events[-2]["error"]["message"]
            c.prefill[0].hang = True
            status, _, _ = await c.post("/generate", {"text": "x"})
            assert status == 504

    run(scenario())


def test_least_inflight_avoids_a_busy_decode():
    async def scenario():
        async with running_cluster(1, 2, args=["--decode-policy", "least_inflight"]) as c:
            slow, fast = c.decode
            slow.latency = 0.5
            pool = c.lb.pool
            # hold the slow decode busy with one request, then count where the rest go
            busy = asyncio.create_task(c.post("/generate", {"text": "x"}))
            await c.wait_for(
                lambda: pool.get(slow.url).inflight + pool.get(fast.url).inflight == 1,
                what="one in flight",
            )
            if pool.get(fast.url).inflight:  # the first went to the fast one: swap roles
                slow, fast = fast, slow
            sent_before = len(fast.requests)
            for _ in range(5):
                status, _, _ = await c.post("/generate", {"text": "y"})
                assert status == 200
            assert len(fast.requests) - sent_before == 5
            await busy

    run(scenario())


def test_prefix_affinity_keeps_a_prefix_on_one_prefill():
    async def scenario():
        async with running_cluster(3, 1, args=["--prefill-policy", "prefix_affinity"]) as c:
            system = "You are a careful assistant. " * 20
            for i in range(6):
                status, _, _ = await c.post("/generate", {"text": system + f"question {i}"})
                assert status == 200
            used = [w for w in c.prefill if w.requests]
            assert len(used) == 1 and len(used[0].requests) == 6
            for i in range(30):
                await c.post("/generate", {"text": f"{i} unrelated prompt"})
            assert all(w.requests for w in c.prefill)

    run(scenario())


def test_round_robin_and_random_use_every_worker():
    async def scenario():
        async with running_cluster(
            2, 2, args=["--prefill-policy", "round_robin", "--decode-policy", "random"]
        ) as c:
            for _ in range(20):
                status, _, _ = await c.post("/generate", {"text": "x"})
                assert status == 200
            assert [len(w.requests) for w in c.prefill] == [10, 10]
            assert all(len(w.requests) >= 3 for w in c.decode)

    run(scenario())
