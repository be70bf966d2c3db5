"""The poison-request rule (kit/lb/poison.py)."""

from __future__ import annotations

from kit.lb.poison import MAX_TRACKED, PoisonGuard, fingerprint


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_first_death_is_retried_the_second_refuses_the_body():
    clock = Clock()
    guard = PoisonGuard(quarantine_s=60, clock=clock)
    key = fingerprint(b'{"input_ids": [1, 2, 999999999]}')
    assert guard.refusal(key) is None
    assert guard.worker_died(key) is True  # retried once
    assert guard.refusal(key) is None
    assert guard.worker_died(key) is False  # refused now
    message = guard.refusal(key)
    assert "2 workers died while serving this same request body" in message
    assert key in message
    assert guard.refused_total == 1
    assert guard.quarantined_total == 1
    assert guard.quarantined() == 1


def test_the_refusal_ends_after_the_quarantine():
    clock = Clock()
    guard = PoisonGuard(quarantine_s=60, clock=clock)
    key = fingerprint(b"x")
    guard.worker_died(key)
    guard.worker_died(key)
    clock.now += 61
    assert guard.refusal(key) is None
    assert guard.quarantined() == 0
    assert guard.worker_died(key) is True  # a fresh count


def test_a_first_death_long_ago_is_forgotten():
    clock = Clock()
    guard = PoisonGuard(quarantine_s=60, clock=clock)
    key = fingerprint(b"y")
    guard.worker_died(key)
    clock.now += 120
    assert guard.worker_died(key) is True


def test_other_bodies_are_not_affected():
    guard = PoisonGuard(clock=Clock())
    bad, good = fingerprint(b"bad"), fingerprint(b"good")
    guard.worker_died(bad)
    guard.worker_died(bad)
    assert guard.refusal(good) is None
    assert fingerprint(b"bad") != fingerprint(b"good")
    assert len(bad) == 16


def test_the_memory_is_bounded():
    guard = PoisonGuard(clock=Clock())
    first = fingerprint(b"0")
    guard.worker_died(first)
    for i in range(1, MAX_TRACKED + 1):
        guard.worker_died(fingerprint(str(i).encode()))
    assert guard.worker_died(first) is True  # forgotten, counted afresh
