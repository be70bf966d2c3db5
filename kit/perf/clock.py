"""Clocks that drive the scheduler: real time (the HTTP worker) or virtual time (sweeps).

The scheduler only ever asks a clock for the current model time and to call it back at a
model time; it never sleeps. `RealClock` maps model seconds to the asyncio loop's clock divided
by the speed factor and records how late each callback fires (the emulator's own lag);
`VirtualClock` is a discrete-event loop that jumps from event to event, so thousands of
requests run in seconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

Callback = Callable[[], None]


class Timer(Protocol):
    """A scheduled callback that can be cancelled before it fires."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Model time in seconds since the clock started."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callback) -> Timer: ...


@dataclass
class LagStats:
    """How late real-time callbacks fire, in wall seconds."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    recent: list[float] = field(default_factory=list)
    keep: int = 4096

    def add(self, lag_s: float) -> None:
        self.count += 1
        self.total_s += lag_s
        self.max_s = max(self.max_s, lag_s)
        self.recent.append(lag_s)
        if len(self.recent) > 2 * self.keep:
            del self.recent[: self.keep]

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """Quantile `q` (0..1) of the recent lags."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RealClock:
    """Model time = (loop time - start) x speed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, speed: float = 1.0) -> None:
        self._loop = loop
        self.speed = speed
        self._start = loop.time()
        self.lag = LagStats()

    def now(self) -> float:
        return (self._loop.time() - self._start) * self.speed

    def wall(self, model_s: float) -> float:
        """Wall seconds (loop clock) at which model time `model_s` falls."""
        return self._start + model_s / self.speed

    def call_at(self, when: float, callback: Callback) -> Timer:
        target = self.wall(when)

        def fire() -> None:
            self.lag.add(max(0.0, self._loop.time() - target))
            callback()

        return self._loop.call_at(target, fire)


class _VirtualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A discrete-event loop: `run` fires callbacks in time order without sleeping."""

    def __init__(self) -> None:
        self._now = 0.0
        self._heap: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callback) -> Timer:
        timer = _VirtualTimer(callback)
        heapq.heappush(self._heap, (max(when, self._now), next(self._seq), timer))
        return timer

    def call_later(self, delay: float, callback: Callback) -> Timer:
        return self.call_at(self._now + delay, callback)

    def run(self, until: float | None = None) -> None:
        """Fire callbacks in time order until none are left (or time would pass `until`)."""
        while self._heap:
            when, _, timer = self._heap[0]
            if until is not None and when > until:
                self._now = until
                return
            heapq.heappop(self._heap)
            self._now = when
            if not timer.cancelled:
                timer.callback()
