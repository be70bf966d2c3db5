"""Idle and total time limits for streams, enforced by one periodic check.

A per-read timer (aiohttp's `sock_read`, or `asyncio.timeout` around each read) costs a timer
reschedule for every streamed token; here a stream only stamps the time of its last bytes
(`Guard.touch`, a float store), and one task looks at all open streams a few times per limit
period. A stream that went quiet for `idle` seconds, or outlived `total` seconds, is expired:
its `on_expire` callback closes the upstream response, and the relay reports why from
`Guard.expired`. Limits are enforced to within one tick (at most a quarter of the limit, and
at most 1 s).
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
    """One stream under watch: `touch()` on every read; `expired` says which limit it hit."""

    __slots__ = ("deadline", "expired", "last", "on_expire")

    def __init__(self, now: float, deadline: float | None, on_expire: Callable[[], None]) -> None:
        self.last = now
        self.deadline = deadline
        self.expired: str | None = None  # "idle" or "total" once expired
        self.on_expire = on_expire

    def touch(self) -> None:
        self.last = time.monotonic()


class Watchdog:
    """Expires guards idle for more than `idle` s or older than `total` s (None = no limit)."""

    def __init__(self, idle: float | None, total: float | None) -> None:
        self.idle = idle
        self.total = total
        limits = [x for x in (idle, total) if x]
        self.tick = min(max(min(limits) / 4, MIN_TICK), MAX_TICK) if limits else MAX_TICK
        self._guards: set[Guard] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, on_expire: Callable[[], None]) -> Guard:
        """Start watching a stream; `on_expire` runs once if a limit is hit."""
        now = time.monotonic()
        guard = Guard(now, now + self.total if self.total else None, on_expire)
        if self.idle or self.total:
            self._guards.add(guard)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run())
        return guard

    def release(self, guard: Guard) -> None:
        self._guards.discard(guard)

    def check(self, now: float) -> None:
        """Expire every guard past a limit at time `now` (s, monotonic)."""
        idle = self.idle
        for guard in list(self._guards):
            if guard.deadline is not None and now >= guard.deadline:
                guard.expired = "total"
            elif idle and now - guard.last >= idle:
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
