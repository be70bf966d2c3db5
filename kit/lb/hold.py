"""The hold: a request that finds no routable worker of a role (a restart: its worker listed as
returning, `kit.lb.admin`; a worker coming back from an ejection) waits for one up to
--hold-timeout s, at most --hold-max requests at once; then, or past those, it gets a 503 with
Retry-After that names every worker of the role and its state."""

from __future__ import annotations

import math
import time

from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError
from kit.lb.exchange import Exchange
from kit.lb.metrics import LbMetrics
from kit.lb.workers import Worker, WorkerPool


class Hold:
    """Requests waiting for a routable worker; `held` is how many wait now."""

    def __init__(self, config: LbConfig, pool: WorkerPool, metrics: LbMetrics) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self.held = 0  # requests waiting for a worker now

    async def wait(self, ex: Exchange, role: Role, exclude: set[str]) -> list[Worker]:
        """Wait up to `hold_timeout` s for a routable worker of `role` (a restart, a worker
        coming back from an ejection); the 503 with Retry-After when none comes."""
        config = self._config
        if not self._pool.role(role) or config.hold_timeout <= 0 or self.held >= config.hold_max:
            raise self._no_worker(role, exclude, held=False)
        started = time.monotonic()
        deadline = started + config.hold_timeout
        self.held += 1
        self._metrics.held = self.held
        self._metrics.hold(role)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._no_worker(role, exclude, held=True)
                await self._pool.wait_change(left)
                workers = self._pool.routable(role)
                if workers:
                    return workers
        finally:
            self.held -= 1
            self._metrics.held = self.held
            ex.held_s += time.monotonic() - started

    def _no_worker(self, role: Role, exclude: set[str], *, held: bool) -> ApiError:
        all_workers = self._pool.role(role)
        if not all_workers:
            return ApiError(503, f"no {role} worker is configured", f"no_{role}")
        why = "; ".join(
            f"{w.url} {w.state.value} ({w.reason})"
            + (", failed in this request" if w.url in exclude else "")
            for w in all_workers
        )
        config = self._config
        if held:
            waited = f" (waited {config.hold_timeout:g} s, --hold-timeout)"
        elif config.hold_timeout > 0 and self.held >= config.hold_max:
            waited = f" ({self.held} requests already wait for a worker, --hold-max)"
        else:
            waited = ""
        now = time.monotonic()
        back = min((max(w.next_probe_at - now, 0.0) for w in all_workers), default=0.0)
        return ApiError(
            503,
            f"no healthy {role} worker available{waited}: {why}",
            f"no_{role}",
            headers={"Retry-After": str(max(1, math.ceil(back)))},
        )
