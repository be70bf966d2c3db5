"""The poison-request rule (kit/lb/poison.py): its books, and the router under a request that
kills its prefill (fake workers, real sockets)."""

from __future__ import annotations

import asyncio

import pytest

from kit.lb.errors import ApiError
from kit.lb.poison import MAX_TRACKED, PoisonGuard, fingerprint
from tests.support.lb_cluster import run, running_cluster

RR = ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
POISON = {"text": "POISON please", "sampling_params": {"max_new_tokens": 4}}
P0 = "http://p0"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_first_death_pins_the_body_to_its_prefill_and_a_second_refuses_it():
    clock = Clock()
    guard = PoisonGuard(quarantine_s=60, clock=clock)
    key = fingerprint("/generate", b'{"input_ids": [1, 2, 999999999]}')
    assert guard.pinned(key) is None and not guard
    assert guard.died(key, P0) is True  # a suspect: only to P0 again
    assert guard.pinned(key) == P0
    assert guard.died(key, P0) is False  # poison now
    with pytest.raises(ApiError) as refused:
        guard.pinned(key)
    assert refused.value.cause == "poison_refused" and refused.value.status == 502
    assert "a prefill died 2 times" in refused.value.message and key in refused.value.message
    assert (guard.suspects_total, guard.refused_total, guard.quarantined_total) == (1, 1, 1)
    assert guard.counts() == (0, 1)


def test_a_suspect_served_well_is_cleared():
    guard = PoisonGuard(clock=Clock())
    key = fingerprint("/generate", b"x")
    guard.died(key, P0)
    guard.served(key)
    assert guard.pinned(key) is None and guard.cleared_total == 1
    assert guard.died(key, P0) is True  # a fresh count


def test_the_refusal_ends_after_the_quarantine():
    clock = Clock()
    guard = PoisonGuard(quarantine_s=60, clock=clock)
    key = fingerprint("/generate", b"x")
    guard.died(key, P0)
    guard.died(key, P0)
    clock.now += 61
    assert guard.pinned(key) is None
    assert guard.counts() == (0, 0)
    assert guard.died(key, P0) is True


def test_other_bodies_and_routes_are_not_affected():
    guard = PoisonGuard(clock=Clock())
    bad = fingerprint("/generate", b"bad")
    guard.died(bad, P0)
    guard.died(bad, P0)
    assert guard.pinned(fingerprint("/generate", b"good")) is None
    assert guard.pinned(fingerprint("/v1/completions", b"bad")) is None
    assert len(bad) == 16


def test_the_memory_is_bounded():
    guard = PoisonGuard(clock=Clock())
    first = fingerprint("/generate", b"0")
    guard.died(first, P0)
    for i in range(1, MAX_TRACKED + 1):
        guard.died(fingerprint("/generate", str(i).encode()), P0)
    assert guard.pinned(first) is None  # forgotten


# -- the router ------------------------------------------------------------------------------


def _poison_seen(cluster) -> list[str]:
    return [w.url for w in cluster.prefill if any("POISON" in str(b) for _, b in w.requests)]


def test_a_request_that_kills_its_prefill_costs_one_server_and_is_then_refused():
    async def scenario():
        async with running_cluster(3, 1, args=[*RR, "--hold-timeout", "0.5"]) as c:
            for worker in c.prefill:
                worker.die_on = "POISON"
            status, body, headers = await c.post("/generate", POISON)
            assert status == 502 and body["error"]["code"] == 502
            assert "died while serving this request" in body["error"]["message"]
            assert "not send it to another worker" in body["error"]["message"]
            assert headers["Retry-After"]
            seen = _poison_seen(c)
            assert len(seen) == 1  # one server lost, not three
            victim = next(w for w in c.prefill if w.url == seen[0])
            for _ in range(4):  # the others keep serving
                status, _, headers = await c.post("/generate", {"text": "fine"})
                assert status == 200 and headers["X-PDKit-Prefill"] != victim.url
            # Sent again: it waits for the prefill it killed, and goes nowhere else.
            status, body, _ = await c.post("/generate", POISON)
            assert status == 502 and "was not back" in body["error"]["message"]
            assert _poison_seen(c) == seen
            # That prefill back (as supervisord restarts it): the request kills it again, and is
            # poison from then on; no other prefill ever saw it.
            await victim.start()
            status, body, _ = await c.post("/generate", POISON)
            assert status == 502 and "a prefill died 2 times" in body["error"]["message"]
            status, body, _ = await c.post("/generate", POISON)
            assert status == 502 and "refuses it for" in body["error"]["message"]
            assert _poison_seen(c) == seen
            assert len([b for _, b in victim.requests if "POISON" in str(b)]) == 2
            _, metrics, _ = await c.get("/metrics")
            text = metrics.decode()
            assert "pdkit_lb_poison_suspects_total 1.0" in text
            assert "pdkit_lb_poison_quarantined_total 1.0" in text
            assert 'pdkit_lb_poison_bodies{state="refused"} 1.0' in text
            assert 'pdkit_lb_errors_total{cause="poison_refused"}' in text
            assert 'pdkit_lb_errors_total{cause="poison_suspect"}' in text

    run(scenario())


def test_an_innocent_request_whose_prefill_is_killed_is_served_once_it_is_back():
    async def scenario():
        async with running_cluster(2, 1, args=[*RR, "--hold-timeout", "5"]) as c:
            victim = c.prefill[0]
            victim.latency = 0.3
            request = asyncio.create_task(c.post("/generate", {"text": "innocent"}))
            await c.wait_for(lambda: victim.inflight, what="the request on the victim")
            await victim.stop()  # SIGKILL
            await asyncio.sleep(0.3)
            victim.latency = 0.0
            await victim.start()  # back on its port
            status, body, headers = await request
            assert status == 200, body
            assert headers["X-PDKit-Prefill"] == victim.url  # the prefill it was on
            assert not c.prefill[1].requests
            assert c.lb.poison.counts() == (0, 0) and c.lb.poison.cleared_total == 1

    run(scenario())


def test_a_connection_lost_to_a_prefill_that_is_alive_is_retried_on_a_fresh_pair():
    async def scenario():
        async with running_cluster(2, 1, args=RR) as c:
            c.prefill[0].drop_next = 1
            status, body, headers = await c.post("/generate", {"text": "x"})
            assert status == 200, body
            assert headers["X-PDKit-Prefill"] == c.prefill[1].url
            assert c.lb.poison.suspects_total == 0 and not c.lb.poison

    run(scenario())
