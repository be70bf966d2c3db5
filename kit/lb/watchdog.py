"""Idle and total time limits of upstream legs and streams, enforced by one periodic check.

A timer per leg (`asyncio.timeout`), or per read (aiohttp's `sock_read`), costs a timer
schedule and cancel for every request or every streamed token; here a stream only stamps the
time of its last bytes (`Guard.touch`, a float store), and one task looks at all open guards a
few times per limit period. A guard that went quiet for its `idle` seconds, or outlived its
`total` seconds, is expired: its `on_expire` callback aborts the upstream exchange, and the
caller reports why from `Guard.expired`. Limits are enforced to within one tick (at most a
quarter of the shortest limit, and at most 1 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

# Bounds on the period of the check (s).
MIN_TICK = 0.02
MAX_TICK = 1.0


class Guard:
    """One leg or stream under watch: `touch()` on every read; `expired` says which limit it
    hit ("idle" or "total")."""

    __slots__ = ("deadline", "expired", "idle", "last", "on_expire")

    def __init__(
        self,
        now: float,
        deadline: float | None,
        idle: float | None,
        on_expire: Callable[[], None],
    ) -> None:
        self.last = now
        self.deadline = deadline
        self.idle = idle
        self.expired: str | None = None
        self.on_expire = on_expire

    def touch(self) -> None:
        self.last = time.monotonic()


class Watchdog:
    """Expires guards past their limits; `limits` (s) are every limit a guard may get, and set
    how often it looks (0 or None: no limit)."""

    def __init__(self, *limits: float | None) -> None:
        given = [x for x in limits if x]
        self.tick = min(max(min(given) / 4, MIN_TICK), MAX_TICK) if given else MAX_TICK
        self._guards: set[Guard] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(
        self, on_expire: Callable[[], None], *, total: float | None, idle: float | None = None
    ) -> Guard:
        """Start watching; `on_expire` runs once if the guard is quiet for `idle` s or lives
        `total` s (None or 0: no such limit)."""
        now = time.monotonic()
        guard = Guard(now, now + total if total else None, idle or None, on_expire)
        if total or idle:
            self._guards.add(guard)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run())
        return guard

    def release(self, guard: Guard) -> None:
        self._guards.discard(guard)

    def check(self, now: float) -> None:
        """Expire every guard past a limit at time `now` (s, monotonic)."""
        for guard in list(self._guards):
            idle = guard.idle
            if guard.deadline is not None and now >= guard.deadline:
                guard.expired = "total"
            elif idle is not None and now - guard.last >= idle:
                guard.expired = "idle"
            else:
                continue
            self._guards.discard(guard)
            guard.on_expire()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.check(time.monotonic())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._guards.clear()
