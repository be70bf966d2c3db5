"""Workers, their health state machine, and the pool the policies choose from.

A worker is routable only when `healthy`. The transitions, all driven through `WorkerPool` so
that the routable lists stay current:

    pending ──first good probe──▶ healthy ─`eject_after_failed_probes`──▶ unhealthy
                                  (a probe that times out while the worker has requests in
                                   flight and made progress within `busy_grace` s is not a
                                   failure: a busy SGLang answers /health late)
       ▲                            │  ▲                                      │
       │                            │  └──────`readmit_after` good probes─────┘
       │                            ├──connection error: out for a backoff──▶ unhealthy
       │                            ├──`eject_after_failed_requests` in a row──▶ unhealthy
       │                            │  (5xx, transport, timeouts, stalls: outlier detection as
       │                            │  in Envoy), while another worker of its role is routable;
       │                            │  out for a backoff growing with each such ejection
       │                            └──the token canary: all its pairs wrong──▶ unhealthy
       │                               (kit.lb.canary; only a canary round readmits it)
    (added)                     any ──admin remove──▶ draining ──in-flight 0──▶ (removed)
                                                          │ (removed with ?back_within=S: an
                                                          ▼  operator replaces the process)
      (added again: a new process) ◀──admin add──── returning ──S s pass──▶ (removed)

A returning worker is not probed and not routable, but it counts as its role's worker: requests
for a role whose only worker is returning are held (`kit.lb.hold`), not refused, until the
operator adds it again (after its own gates) and its first good probe makes it routable.

An unhealthy worker is probed every `recovery_interval` s (at most 0.5 s), and one that was out
because it refused connections (it was down) is readmitted at its first good probe, so that a
restarted worker is routable again within half a second of answering: requests held for its
role are waiting.

Times are `time.monotonic()` seconds, passed in so the rules are testable without a clock.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

from kit.lb.config import Role, WorkerSpec


class State(enum.Enum):
    PENDING = "pending"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    RETURNING = "returning"


@dataclass(frozen=True, slots=True)
class HealthRules:
    """Health thresholds: a probe every `interval` s; a passive ejection lasts `backoff` s,
    doubling on each repeat up to `backoff_max` s; a timed-out probe of a worker that made
    progress within `busy_grace` s is forgiven."""

    interval: float = 5.0
    busy_grace: float = 20.0
    eject_after_failed_probes: int = 3
    readmit_after: int = 2
    backoff: float = 1.0
    backoff_max: float = 30.0
    eject_after_failed_requests: int = 3

    @property
    def recovery_interval(self) -> float:
        """Seconds between probes of a worker that is out (at most 0.5 s)."""
        return min(self.interval, 0.5)

    def backoff_for(self, repeats: int) -> float:
        """Ejection time (s) after the `repeats`-th connection error in a row (1-based)."""
        return float(min(self.backoff * 2 ** max(repeats - 1, 0), self.backoff_max))


@dataclass(eq=False, slots=True)
class Worker:
    """One SGLang server as the load balancer tracks it."""

    spec: WorkerSpec
    url: str = ""
    role: Role = "prefill"
    bootstrap_host: str = ""
    state: State = State.PENDING
    # Why the worker is not routable, and the short label used in metrics.
    reason: str = "waiting for the first health probe"
    reason_kind: str = "pending"
    since: float = 0.0
    last_probe_error: str | None = None
    inflight: int = 0
    requests: int = 0
    # When a leg on this worker last made progress (a leg ended, stream bytes came; monotonic).
    progress_at: float = 0.0
    failed_probes: int = 0
    good_probes: int = 0
    connection_errors: int = 0
    # Failed requests in a row (any cause but the client's), and outlier ejections in a row.
    failures: int = 0
    failure_ejections: int = 0
    next_probe_at: float = 0.0
    probes_ok: int = 0
    probes_failed: int = 0
    probes_busy: int = 0
    ejections: dict[str, int] = field(default_factory=dict)
    # Stable per-worker value mixed into prefix_affinity scores.
    affinity_seed: int = 0
    _urls: dict[str, URL] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.url = self.spec.url
        self.role = self.spec.role
        self.bootstrap_host = self.spec.bootstrap_host
        digest = hashlib.blake2b(self.url.encode(), digest_size=8).digest()
        self.affinity_seed = int.from_bytes(digest, "little")

    def endpoint(self, path: str) -> URL:
        """The worker's URL for `path`, parsed once (URL parsing is per-request work)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.url + path)
        return url

    @property
    def bootstrap_port(self) -> int | None:
        return self.spec.bootstrap_port

    @property
    def routable(self) -> bool:
        return self.state is State.HEALTHY

    def describe(self, now: float) -> dict[str, Any]:
        """JSON view for /workers and /readiness; `for_s` is seconds in the current state."""
        return {
            "url": self.url,
            "role": self.role,
            "bootstrap_port": self.bootstrap_port,
            "state": self.state.value,
            "reason": None if self.routable else self.reason,
            "for_s": round(max(now - self.since, 0.0), 3),
            "last_probe_error": self.last_probe_error,
            "inflight": self.inflight,
            "requests": self.requests,
        }


Listener = Callable[[Worker, State, State], None]


class WorkerPool:
    """All workers by URL, and the routable ones per role (rebuilt on every transition)."""

    def __init__(self, rules: HealthRules, listener: Listener | None = None) -> None:
        self.rules = rules
        self._workers: dict[str, Worker] = {}
        self._routable: dict[Role, list[Worker]] = {"prefill": [], "decode": []}
        self._listener = listener
        self._waiters: list[asyncio.Future[None]] = []

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, url: str) -> Worker | None:
        return self._workers.get(url)

    def role(self, role: Role) -> list[Worker]:
        """Every worker of a role, routable or not, in the order added."""
        return [w for w in self._workers.values() if w.role == role]

    def routable(self, role: Role) -> list[Worker]:
        """The workers a policy may choose (do not mutate the list)."""
        return self._routable[role]

    def add(self, spec: WorkerSpec, now: float) -> Worker:
        """Add a worker in state pending; it becomes routable after its first good probe."""
        if spec.url in self._workers:
            raise KeyError(spec.url)
        worker = Worker(spec, since=now, next_probe_at=now)
        self._workers[spec.url] = worker
        return worker

    def remove(self, url: str) -> Worker | None:
        worker = self._workers.pop(url, None)
        if worker is not None:
            self._rebuild()
        return worker

    def drain(self, worker: Worker, now: float) -> None:
        """Stop routing new requests to `worker`; in-flight ones finish."""
        self._set(worker, State.DRAINING, "removed by admin, draining", "draining", now)

    def returning(self, worker: Worker, within: float, now: float) -> None:
        """`worker` (drained) is being replaced and expected back within `within` s: it stays
        its role's worker, unrouted and unprobed, so that requests for its role are held."""
        reason = f"being replaced, expected back within {within:g} s"
        self._set(worker, State.RETURNING, reason, "returning", now)
        worker.next_probe_at = now + within  # Retry-After says when

    def busy(self, worker: Worker, now: float) -> bool:
        """Whether `worker` is finishing requests: some in flight, and one ended or streamed
        within `busy_grace` s."""
        return worker.inflight > 0 and now - worker.progress_at < self.rules.busy_grace

    async def wait_change(self, timeout: float) -> None:
        """Wait until the routable workers change, or `timeout` s (no error either way)."""
        if timeout <= 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def record_probe(self, worker: Worker, ok: bool, detail: str, now: float) -> None:
        """Apply one active health probe result; schedules the next probe."""
        rules = self.rules
        out = worker.state is State.UNHEALTHY
        worker.next_probe_at = now + (rules.recovery_interval if out else rules.interval)
        if ok:
            worker.probes_ok += 1
            worker.good_probes += 1
            worker.failed_probes = 0
            worker.last_probe_error = None
            # A worker that refused connections was down; answering, it is back.
            needed = 1 if worker.reason_kind == "connection_error" else rules.readmit_after
            if worker.state is State.PENDING or (
                worker.state is State.UNHEALTHY
                and worker.good_probes >= needed
                and worker.reason_kind != "canary"  # /health passes; only its tokens readmit
            ):
                self._set(worker, State.HEALTHY, "", "", now)
            return
        worker.probes_failed += 1
        worker.failed_probes += 1
        worker.good_probes = 0
        worker.last_probe_error = detail
        if worker.state is State.PENDING:
            worker.reason = f"not ready: {detail}"
        elif (
            worker.state is State.HEALTHY
            and worker.failed_probes >= rules.eject_after_failed_probes
        ):
            reason = f"health check failed {worker.failed_probes} times in a row: {detail}"
            self._set(worker, State.UNHEALTHY, reason, "health_check", now)

    def record_busy_probe(self, worker: Worker, detail: str, now: float) -> None:
        """A probe timed out while the worker is still finishing requests (a busy SGLang answers
        /health late): it counts neither way."""
        worker.next_probe_at = now + self.rules.interval
        worker.probes_busy += 1
        worker.last_probe_error = f"{detail} (busy with {worker.inflight} requests: not counted)"

    def record_connection_error(self, worker: Worker, detail: str, now: float) -> float | None:
        """Passive ejection: a worker that refused a connection is out for a growing backoff.

        Returns the backoff in seconds, or None when the worker was not routable anyway.
        """
        if worker.state not in (State.HEALTHY, State.PENDING):
            return None
        worker.connection_errors += 1
        backoff = self.rules.backoff_for(worker.connection_errors)
        worker.good_probes = 0
        worker.next_probe_at = now + backoff
        reason = f"connection error: {detail} (out for at least {backoff:g} s)"
        self._set(worker, State.UNHEALTHY, reason, "connection_error", now)
        return backoff

    def record_failure(self, worker: Worker, detail: str, now: float) -> float | None:
        """Outlier detection: one more request failed on `worker` (a 5xx, a broken
        connection, a timeout, a stall). After `eject_after_failed_requests` in a row it is
        out for a backoff that grows with each such ejection, unless it is the last routable
        worker of its role (then the failures only count: ejecting it would fail every
        request).

        Returns the backoff in seconds when this failure ejected it, else None.
        """
        worker.failures += 1
        if (
            worker.state is not State.HEALTHY
            or worker.failures < self.rules.eject_after_failed_requests
        ):
            return None
        if not any(w is not worker for w in self._routable[worker.role]):
            return None
        worker.failure_ejections += 1
        backoff = self.rules.backoff_for(worker.failure_ejections)
        worker.failures = 0
        worker.good_probes = 0
        worker.next_probe_at = now + backoff
        reason = (
            f"{self.rules.eject_after_failed_requests} requests failed in a row: {detail} "
            f"(out for at least {backoff:g} s)"
        )
        self._set(worker, State.UNHEALTHY, reason, "failures", now)
        return backoff

    def quarantine(self, worker: Worker, reason: str, now: float) -> None:
        """The token canary found every pair of `worker` giving wrong tokens while other pairs
        agree (`kit.lb.canary`): out until a canary round finds its pairs right again (its
        health probes pass and do not readmit it)."""
        if worker.state is State.HEALTHY:
            self._set(worker, State.UNHEALTHY, reason, "canary", now)

    def release(self, worker: Worker, now: float) -> None:
        """The token canary found the pairs of a worker it took out right again."""
        if worker.state is State.UNHEALTHY and worker.reason_kind == "canary":
            worker.failures = worker.failure_ejections = 0
            self._set(worker, State.HEALTHY, "", "", now)

    def record_success(self, worker: Worker) -> None:
        """A connection went through: the connection-error backoff starts over."""
        worker.connection_errors = 0

    def record_served(self, worker: Worker) -> None:
        """A request's leg ended well on `worker`: its failure counts start over."""
        worker.failures = 0
        worker.failure_ejections = 0

    def _set(self, worker: Worker, state: State, reason: str, kind: str, now: float) -> None:
        old = worker.state
        worker.reason = reason
        worker.reason_kind = kind
        if old is state:
            return
        worker.state = state
        worker.since = now
        if state is State.UNHEALTHY:
            worker.ejections[kind] = worker.ejections.get(kind, 0) + 1
        self._rebuild()
        if self._listener is not None:
            self._listener(worker, old, state)

    def _rebuild(self) -> None:
        for role in ("prefill", "decode"):
            self._routable[role] = [
                w for w in self._workers.values() if w.role == role and w.routable
            ]
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
