"""Worker selection policies, one instance per role.

- `round_robin`: the next routable worker in turn.
- `random`: uniform choice.
- `least_inflight`: power of two choices on in-flight requests (two random candidates, the less
  loaded wins), which avoids the herding of a strict least-loaded pick.
- `prefix_affinity` (prefill only): rendezvous hashing of the prompt prefix, so that requests
  sharing a prefix reach the same prefill and reuse its radix cache; bounded by load
  (consistent hashing with bounded loads): a worker already above `load_factor` times the mean
  in-flight load is passed over for the next one in the prefix's preference order. Requests
  without a prompt fall back to `least_inflight`.

`choose` gets a non-empty list of routable workers and never blocks.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Sequence
from typing import Protocol

from kit.lb.workers import Worker

_MASK64 = (1 << 64) - 1


class Policy(Protocol):
    """Chooses one worker of a role."""

    name: str
    needs_key: bool

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        """One of `workers` (non-empty); `key` is the prompt prefix when `needs_key`."""


class RoundRobin:
    name = "round_robin"
    needs_key = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        return workers[next(self._counter) % len(workers)]


class RandomChoice:
    name = "random"
    needs_key = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        return workers[self._rng.randrange(len(workers))] if len(workers) > 1 else workers[0]


class LeastInflight:
    name = "least_inflight"
    needs_key = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        count = len(workers)
        if count == 1:
            return workers[0]
        if count == 2:
            a, b = workers[0], workers[1]
            if a.inflight == b.inflight:
                return a if self._rng.random() < 0.5 else b
        else:
            i, j = self._rng.sample(range(count), 2)
            a, b = workers[i], workers[j]
        return b if b.inflight < a.inflight else a


def _mix64(value: int) -> int:
    """splitmix64 finalizer: a cheap, well-spread 64-bit hash of an integer."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK64
    return value ^ (value >> 31)


def prefix_hash(key: bytes) -> int:
    """Stable 64-bit hash of a prompt prefix (the same across restarts and hosts)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class PrefixAffinity:
    name = "prefix_affinity"
    needs_key = True

    def __init__(self, rng: random.Random, load_factor: float = 1.25) -> None:
        self._fallback = LeastInflight(rng)
        self.load_factor = load_factor

    def preference(self, workers: Sequence[Worker], key: bytes) -> list[Worker]:
        """`workers` in the order this prefix prefers them (highest rendezvous score first)."""
        h = prefix_hash(key)
        return sorted(workers, key=lambda w: _mix64(h ^ w.affinity_seed), reverse=True)

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        if key is None:
            return self._fallback.choose(workers, None)
        count = len(workers)
        if count == 1:
            return workers[0]
        total = 1
        for w in workers:
            total += w.inflight
        cap = math.ceil(self.load_factor * total / count)
        h = prefix_hash(key)
        best = max(workers, key=lambda w: _mix64(h ^ w.affinity_seed))
        if best.inflight + 1 <= cap:
            return best
        for worker in self.preference(workers, key)[1:]:
            if worker.inflight + 1 <= cap:
                return worker
        return best  # unreachable: the least loaded worker is always under the cap


def make_policy(name: str, rng: random.Random, load_factor: float = 1.25) -> Policy:
    """A policy by its command-line name."""
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice(rng)
    if name == "least_inflight":
        return LeastInflight(rng)
    if name == "prefix_affinity":
        return PrefixAffinity(rng, load_factor)
    raise ValueError(f"unknown policy {name!r}")
