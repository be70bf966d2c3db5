"""The prefill queue of --prefill-max-inflight: requests beyond the prefills' room wait in the
router, oldest first, instead of queueing inside a prefill.

1. `turn`: a request arriving waits behind those that came first until a routable prefill has
   a free slot (at once where none waits and there is room; without a limit, never).
2. `claim`: the slot is promised to it until its prefill leg starts (then the prefill's own
   `inflight` counts it) or its attempt ends before one did.
3. `next_turn`: as a prefill leg ends, the oldest waiting request is woken; a prefill that
   joins is seen within `TURN_POLL_S`.
4. `with_room`: the choice of a prefill keeps to those under the limit where there are such.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from kit.lb.exchange import Exchange
from kit.lb.metrics import LbMetrics
from kit.lb.workers import Worker, WorkerPool

TURN_POLL_S = 0.5
"""Seconds between two looks at the prefills by a request waiting for its turn (a prefill
that joins wakes no one)."""


class PrefillQueue:
    """Requests waiting for a prefill with room (`limit` requests in flight per prefill;
    0: no limit)."""

    def __init__(self, limit: int, pool: WorkerPool, metrics: LbMetrics) -> None:
        self._limit = limit
        self._pool = pool
        self._metrics = metrics
        self._turns: deque[asyncio.Future[None]] = deque()  # waiting for a prefill with room
        self._passing = 0  # requests past their turn whose prefill leg has not started yet

    def with_room(self, workers: list[Worker]) -> list[Worker]:
        """Those of `workers` with fewer than `limit` requests in flight."""
        limit = self._limit
        return [w for w in workers if w.inflight < limit]

    def _room(self) -> bool:
        """A prefill slot free for one more request: the routable prefills' free slots less
        those already promised to requests on their way to a prefill."""
        limit = self._limit
        free = sum(max(0, limit - w.inflight) for w in self._pool.routable("prefill"))
        return free > self._passing

    async def turn(self, ex: Exchange) -> None:
        """Wait, behind the requests that came first, until a routable prefill has room
        (returns at once without a limit); the slot is promised to `ex` until its prefill leg
        starts (`claim`). A turn is handed on as a prefill leg ends; a prefill that joins is
        seen within `TURN_POLL_S`."""
        if self._limit <= 0:
            return
        if not self._turns and self._room():
            self.claim(ex, True)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        self._metrics.queued = len(self._turns)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(turn), TURN_POLL_S)
                first = self._turns[0] is turn
                if (turn.done() or first) and self._room():
                    self.claim(ex, True)
                    return
                if turn.done():  # woken, but the room went to a request that did not wait
                    turn = asyncio.get_running_loop().create_future()
                    self._turns.appendleft(turn)
        finally:
            with contextlib.suppress(ValueError):
                self._turns.remove(turn)
            self._metrics.queued = len(self._turns)
            self.next_turn()

    def claim(self, ex: Exchange, take: bool) -> None:
        """Promise `ex` a prefill slot (`take`), or end the promise: its prefill leg started,
        or the attempt ended before one did."""
        if take and not ex.claimed:
            self._passing += 1
        elif not take and ex.claimed:
            self._passing -= 1
        ex.claimed = take

    def next_turn(self) -> None:
        """Wake the oldest waiting request when a prefill has room."""
        if self._turns and self._room():
            turn = self._turns[0]
            if not turn.done():
                turn.set_result(None)
