"""Limits per client (--client-limits, router.limits): a client over its token bucket gets 429
with Retry-After in OpenAI's error shape while the others keep their share; counted per
client name (never the key) in /metrics."""

from __future__ import annotations

import hashlib

import pytest

from kit.lb.errors import ApiError
from kit.lb.limits import ClientLimits, TokenBucket
from kit.topology.client_limits import ClientLimit, format_limits, parse_limits
from kit.topology.router_options import DEFAULTS, option_problems
from tests.support.lb_cluster import run, running_cluster

GREEDY_KEY, POLITE_KEY = "sk-greedy-0123", "sk-polite-4567"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_its_burst_refills_at_its_rate_and_lets_a_big_prompt_through_full():
    clock = Clock()
    bucket = TokenBucket(rate=2.0, capacity=4.0, clock=clock)
    assert [bucket.take(1) for _ in range(4)] == [0.0] * 4
    assert bucket.take(1) == pytest.approx(0.5)  # empty: half a second for one more
    clock.now += 0.5
    assert bucket.take(1) == 0.0
    clock.now += 10  # refills to its capacity, no further
    assert bucket.take(10) == 0.0  # larger than the bucket: passes on a full one, in debt
    assert bucket.take(1) == pytest.approx((1 + 6) / 2)


def test_a_limited_key_is_known_by_its_hash_and_other_keys_need_the_router_s_own():
    limits = ClientLimits(
        [ClientLimit(name="greedy", key_sha256=sha(GREEDY_KEY), requests_per_s=1)], "router-key"
    )
    client = limits.client(f"Bearer {GREEDY_KEY}")
    assert client is not None and client.name == "greedy"
    assert limits.client("Bearer router-key") is None  # the router's own key: not limited
    with pytest.raises(ApiError) as refused:
        limits.client("Bearer someone-else")
    assert refused.value.status == 401
    open_router = ClientLimits(
        [ClientLimit(name="greedy", key_sha256=sha(GREEDY_KEY), requests_per_s=1)], None
    )
    assert open_router.client("") is None


def test_the_text_form_round_trips_and_bad_values_are_told():
    clients = [
        ClientLimit(name="a", key_sha256=sha("k1"), requests_per_s=5, burst_s=2),
        ClientLimit(name="b.team", key_sha256=sha("k2"), prompt_tokens_per_s=1000.5),
    ]
    assert parse_limits(format_limits(clients)) == clients
    with pytest.raises(ValueError, match="NAME=SHA256"):
        parse_limits("a=nothex:1:0:1")
    twice = format_limits([clients[0], clients[0]])
    (problem,) = option_problems(DEFAULTS.__class__(client_limits=twice))
    assert "two clients share the name a" in problem


def test_a_greedy_client_gets_429_with_retry_after_while_the_other_is_served():
    limits = format_limits(
        [
            ClientLimit(name="greedy", key_sha256=sha(GREEDY_KEY), requests_per_s=2, burst_s=1),
            ClientLimit(name="polite", key_sha256=sha(POLITE_KEY), requests_per_s=2, burst_s=1),
        ]
    )

    async def scenario():
        async with running_cluster(1, 1, args=["--client-limits", limits]) as c:
            greedy = [await c.post("/generate", {"text": "g"}, key=GREEDY_KEY) for _ in range(5)]
            polite = [await c.post("/generate", {"text": "p"}, key=POLITE_KEY) for _ in range(2)]
            statuses = [s for s, _, _ in greedy]
            assert statuses[:2] == [200, 200] and set(statuses[2:]) == {429}
            _, body, headers = greedy[-1]
            assert int(headers["Retry-After"]) >= 1
            assert body["error"]["code"] == 429 and "greedy" in body["error"]["message"]
            assert [s for s, _, _ in polite] == [200, 200]
            # An unknown key on an open router is served, unlimited.
            assert (await c.post("/generate", {"text": "x"}, key="anyone"))[0] == 200
            _, raw, _ = await c.get("/metrics")
            text = raw.decode()
            assert 'pdkit_lb_client_limited_total{client="greedy",limit="requests"} 3.0' in text
            assert 'pdkit_lb_client_admitted_total{client="polite"} 2.0' in text
            assert GREEDY_KEY not in text and sha(GREEDY_KEY) not in text

    run(scenario())


def test_prompt_tokens_are_limited_too_and_the_router_s_own_key_is_not():
    limits = format_limits(
        [ClientLimit(name="bulk", key_sha256=sha(GREEDY_KEY), prompt_tokens_per_s=10)]
    )

    async def scenario():
        env = {"PDKIT_LB_API_KEY": "router-key"}
        async with running_cluster(1, 1, args=["--client-limits", limits], env=env) as c:
            ids = list(range(1, 9))  # 8 tokens of a bucket of 10
            first = await c.post("/generate", {"input_ids": ids}, key=GREEDY_KEY)
            second = await c.post("/generate", {"input_ids": ids}, key=GREEDY_KEY)
            assert (first[0], second[0]) == (200, 429)
            assert "prompt tokens" in second[1]["error"]["message"]
            assert (await c.post("/generate", {"input_ids": ids}, key="router-key"))[0] == 200
            assert (await c.post("/generate", {"input_ids": ids}, key="wrong"))[0] == 401
            assert (await c.get("/v1/models", key=GREEDY_KEY))[0] == 200

    run(scenario())
