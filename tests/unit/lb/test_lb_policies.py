"""Selection policies and the worker health state machine (no network)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kit.lb.config import WorkerSpec
from kit.lb.health import evaluate
from kit.lb.metrics import Histogram
from kit.lb.policies import LeastInflight, PrefixAffinity, RandomChoice, RoundRobin, make_policy
from kit.lb.watchdog import Guard, Watchdog
from kit.lb.workers import HealthRules, State, Worker, WorkerPool


def workers(n: int, role: str = "prefill") -> list[Worker]:
    return [Worker(WorkerSpec(f"http://10.0.0.{i}:30000", role)) for i in range(1, n + 1)]


def test_round_robin_takes_turns():
    ws = workers(3)
    rr = RoundRobin()
    picks = [rr.choose(ws, None).url for _ in range(6)]
    assert picks == [w.url for w in ws] * 2


def test_random_spreads_over_all_workers():
    ws = workers(4)
    policy = RandomChoice(random.Random(1))
    counts = Counter(policy.choose(ws, None).url for _ in range(4000))
    assert set(counts) == {w.url for w in ws}
    assert min(counts.values()) > 800


def test_least_inflight_prefers_the_less_loaded_of_two():
    ws = workers(2)
    ws[0].inflight = 5
    policy = LeastInflight(random.Random(1))
    assert all(policy.choose(ws, None) is ws[1] for _ in range(50))


def test_least_inflight_power_of_two_never_picks_the_busiest_of_many():
    ws = workers(5)
    for i, w in enumerate(ws):
        w.inflight = i
    policy = LeastInflight(random.Random(2))
    picks = Counter(policy.choose(ws, None).url for _ in range(2000))
    assert ws[-1].url not in picks
    assert picks[ws[0].url] > picks[ws[3].url]


def test_prefix_affinity_sends_a_prefix_to_the_same_worker_and_spreads_prefixes():
    ws = workers(4)
    policy = PrefixAffinity(random.Random(1))
    key = b"You are a helpful assistant."
    first = policy.choose(ws, key)
    assert all(policy.choose(ws, key) is first for _ in range(20))
    spread = Counter(policy.choose(ws, f"prefix {i}".encode()).url for i in range(400))
    assert len(spread) == 4 and min(spread.values()) > 50


def test_prefix_affinity_is_stable_when_another_worker_leaves():
    ws = workers(4)
    policy = PrefixAffinity(random.Random(1))
    keys = [f"k{i}".encode() for i in range(200)]
    before = {k: policy.choose(ws, k) for k in keys}
    gone = ws[0]
    after = {k: policy.choose(ws[1:], k) for k in keys}
    moved = [k for k in keys if before[k] is not gone and after[k] is not before[k]]
    assert moved == []


def test_prefix_affinity_is_bounded_by_load():
    ws = workers(2)
    policy = PrefixAffinity(random.Random(1), load_factor=1.25)
    key = b"hot prefix"
    home = policy.choose(ws, key)
    other = next(w for w in ws if w is not home)
    home.inflight = 10
    assert policy.choose(ws, key) is other
    home.inflight = 1
    assert policy.choose(ws, key) is home


def test_prefix_affinity_without_a_prompt_falls_back_to_least_inflight():
    ws = workers(2)
    ws[0].inflight = 3
    assert PrefixAffinity(random.Random(1)).choose(ws, None) is ws[1]


def test_unknown_policy_name_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("cache_aware", random.Random())


RULES = HealthRules(
    interval=1.0, eject_after_failed_probes=3, readmit_after=2, backoff=1.0, backoff_max=4.0
)


def pool_with(n: int = 1) -> tuple[WorkerPool, list[Worker], list[tuple[str, str, str]]]:
    events: list[tuple[str, str, str]] = []
    pool = WorkerPool(RULES, listener=lambda w, a, b: events.append((w.url, a.value, b.value)))
    ws = [pool.add(WorkerSpec(f"http://h{i}:1", "decode"), 0.0) for i in range(n)]
    return pool, ws, events


def test_a_new_worker_is_routable_only_after_its_first_good_probe():
    pool, (w,), events = pool_with()
    assert pool.routable("decode") == []
    pool.record_probe(w, False, "HTTP 503: starting", 0.0)
    assert w.state is State.PENDING and "starting" in w.reason
    pool.record_probe(w, True, "HTTP 200", 1.0)
    assert pool.routable("decode") == [w]
    assert events == [("http://h0:1", "pending", "healthy")]


def test_ejected_after_consecutive_failures_and_readmitted_after_consecutive_successes():
    pool, (w,), _ = pool_with()
    pool.record_probe(w, True, "ok", 0.0)
    pool.record_probe(w, False, "HTTP 500", 1.0)
    pool.record_probe(w, True, "ok", 2.0)  # a success resets the count
    pool.record_probe(w, False, "HTTP 500", 3.0)
    pool.record_probe(w, False, "HTTP 500", 4.0)
    assert w.routable
    pool.record_probe(w, False, "HTTP 500", 5.0)
    assert w.state is State.UNHEALTHY and "3 times in a row" in w.reason
    assert w.reason_kind == "health_check" and w.ejections == {"health_check": 1}
    pool.record_probe(w, True, "ok", 6.0)
    assert not w.routable
    pool.record_probe(w, True, "ok", 7.0)
    assert w.routable and pool.routable("decode") == [w]


def test_connection_error_ejects_at_once_with_a_doubling_backoff():
    pool, (w,), _ = pool_with()
    pool.record_probe(w, True, "ok", 0.0)
    assert pool.record_connection_error(w, "refused", 10.0) == 1.0
    assert w.state is State.UNHEALTHY and w.next_probe_at == 11.0
    assert "connection error: refused" in w.reason
    assert pool.record_connection_error(w, "refused", 10.5) is None  # already out
    pool.record_probe(w, True, "ok", 11.0)
    pool.record_probe(w, True, "ok", 12.0)
    assert w.routable
    assert pool.record_connection_error(w, "refused", 13.0) == 2.0
    for t in (15.0, 16.0):
        pool.record_probe(w, True, "ok", t)
    assert pool.record_connection_error(w, "refused", 17.0) == 4.0
    for t in (21.0, 22.0):
        pool.record_probe(w, True, "ok", t)
    assert pool.record_connection_error(w, "refused", 23.0) == 4.0  # capped
    pool.record_success(w)
    assert w.connection_errors == 0


def test_draining_worker_is_never_routable_whatever_the_probes_say():
    pool, (w,), _ = pool_with()
    pool.record_probe(w, True, "ok", 0.0)
    pool.drain(w, 1.0)
    pool.record_probe(w, True, "ok", 2.0)
    assert w.state is State.DRAINING and pool.routable("decode") == []
    assert w.describe(3.0)["reason"] == "removed by admin, draining"


def test_watchdog_expires_idle_and_overlong_streams_once():
    fired: list[str] = []
    dog = Watchdog(1.0, 10.0)
    dog._guards.add(quiet := Guard(0.0, 10.0, 1.0, lambda: fired.append("quiet")))
    dog._guards.add(busy := Guard(0.0, 10.0, 1.0, lambda: fired.append("busy")))
    dog._guards.add(leg := Guard(0.0, 5.0, None, lambda: fired.append("leg")))
    busy.last = 0.9
    dog.check(1.5)
    assert fired == ["quiet"] and quiet.expired == "idle" and busy.expired is None
    assert leg.expired is None  # a leg without an idle limit may be quiet
    busy.last = 10.5
    dog.check(10.6)
    dog.check(11.0)
    assert fired[0] == "quiet" and sorted(fired[1:]) == ["busy", "leg"]
    assert busy.expired == "total" == leg.expired
    assert Watchdog(300.0, None).tick == 1.0
    assert Watchdog(0.2, 600.0).tick == 0.05


def test_histogram_buckets_are_cumulative_and_inclusive():
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0):
        hist.observe(value)
    assert hist.cumulative() == [("0.1", 2.0), ("1.0", 3.0), ("+Inf", 4.0)]
    assert hist.count == 4 and hist.sum == pytest.approx(2.65)


def test_health_evaluate_is_a_pure_verdict():
    assert evaluate(200, b"") == (True, "HTTP 200")
    assert evaluate(503, b"starting up\n") == (False, "HTTP 503: starting up")
    assert evaluate(None, b"", "ConnectionRefusedError") == (False, "ConnectionRefusedError")
