"""A prompt the prefill refuses (a 4xx) is answered at once with the prefill's own status and
OpenAI error body, and the decode leg, which would wait for KV that never comes, is cancelled:
the decode holds nothing for it afterwards (issue 37, failure 5: "the router hangs until the
client's timeout when the prefill answers a 4xx")."""

from __future__ import annotations

import time

import pytest

from tests.support.lb_cluster import run, running_cluster, sse_events

REFUSAL = {
    "object": "error",
    "message": "prefill failed on purpose",
    "type": "BadRequestError",
    "code": 400,
}
"""The fake prefill's refusal: the shape SGLang's OpenAI routes answer with."""
KV_WAIT_S = 30.0
"""How long the fake decode would wait for KV: far longer than the answer may take."""

CASES = {
    "generate": ("/generate", {"text": "x"}),
    "completions": ("/v1/completions", {"model": "fake-model", "prompt": "x"}),
    "chat": (
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_prefill_refusal_is_answered_at_once_and_the_decode_leg_is_cancelled(case, stream):
    path, body = CASES[case]

    async def scenario():
        async with running_cluster(1, 1) as c:
            prefill, decode = c.prefill[0], c.decode[0]
            decode.kv_timeout = KV_WAIT_S
            prefill.fail_status = 413
            prefill.latency = 0.05  # the decode leg is out, waiting for KV, when it comes
            started = time.monotonic()
            status, answer, headers = await c.post(path, {**body, "stream": stream})
            took = time.monotonic() - started
            assert status == 413 and took < 1.0, (status, took)
            assert headers["Content-Type"].startswith("application/json")
            assert answer == {**REFUSAL, "code": 413}
            await c.wait_for(lambda: decode.cancelled, what="the decode leg cancelled")
            await c.wait_for(lambda: decode.inflight == 0, what="nothing held on the decode")
            assert c.lb.pool.get(decode.url).inflight == 0 and c.lb.inflight == 0
            # A 4xx is the request's fault: not sent again, not counted against the prefill.
            assert len(prefill.requests) == 1
            assert c.lb.pool.get(prefill.url).failures == 0
            _, metrics, _ = await c.get("/metrics")
            assert f'pdkit_lb_requests_total{{route="{path}",status="413"}} 1.0'.encode() in metrics
            assert b'pdkit_lb_errors_total{cause="prefill_status"} 1.0' in metrics

    run(scenario())


def test_the_decode_serves_the_next_request_at_once_after_a_refusal():
    async def scenario():
        async with running_cluster(1, 1) as c:
            prefill, decode = c.prefill[0], c.decode[0]
            decode.kv_timeout = KV_WAIT_S
            prefill.fail_status, prefill.latency = 400, 0.05
            status, _, _ = await c.post("/generate", {"text": "refused"})
            assert status == 400
            prefill.fail_status = None
            status, raw, _ = await c.post("/generate", {"text": "next", "stream": True})
            assert status == 200 and sse_events(raw)[-1] == b"[DONE]"

    run(scenario())
