"""The poison-request rule: one request must not take down the fleet.

A request during which its worker died (the connection lost mid-request, the worker then found
down) may be a request that kills workers, as an out-of-vocabulary id kills SGLang 0.5.23. So:

1. The first death under a request: it is retried once, on a fresh pair (as today).
2. A second death under the same request body (the retry, or a client sending it again): the
   router refuses it, and refuses the same body for `quarantine_s`, with a clear error naming
   why, counted in /metrics (`pdkit_lb_poison_refused_total`) and named in the access log.

Bodies are matched by a SHA-256 fingerprint of their bytes, so nothing of a prompt is kept.
Deaths older than `quarantine_s` are forgotten. The guard is pure bookkeeping: the dispatcher
says when a worker died under a request and asks before sending one.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

DEATHS_TO_REFUSE = 2
"""Deaths under one body after which it is refused: the first is retried, the second is not."""
QUARANTINE_S = 600.0
"""Seconds a body that killed two workers stays refused (and a first death is remembered)."""
MAX_TRACKED = 4096
"""Bodies remembered at once; the oldest are forgotten first."""


def fingerprint(body: bytes) -> str:
    """The key of a request body: its SHA-256, hex, first 16 characters (64 bits)."""
    return hashlib.sha256(body).hexdigest()[:16]


@dataclass
class _Record:
    deaths: int
    last_s: float
    refused_until_s: float | None = None


class PoisonGuard:
    """Deaths of workers under request bodies, and which bodies are refused."""

    def __init__(
        self,
        *,
        quarantine_s: float = QUARANTINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quarantine_s = quarantine_s
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self.refused_total = 0
        self.quarantined_total = 0

    def _record(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is not None and self._clock() - record.last_s > self.quarantine_s:
            del self._records[key]
            return None
        return record

    def refusal(self, key: str) -> str | None:
        """Why a body is refused now (None: send it). Counts each refusal."""
        record = self._record(key)
        if record is None or record.refused_until_s is None:
            return None
        self.refused_total += 1
        left = max(0.0, record.refused_until_s - self._clock())
        return (
            f"request refused: {record.deaths} workers died while serving this same request "
            f"body (a poison request, fingerprint {key}); it is refused for {left:.0f} s more"
        )

    def worker_died(self, key: str) -> bool:
        """A worker died under the body `key`: True if the request may be retried once more,
        False when this death makes it refused (then for `quarantine_s`)."""
        now = self._clock()
        record = self._record(key)
        if record is None:
            record = self._records[key] = _Record(0, now)
        record.deaths += 1
        record.last_s = now
        self._records.move_to_end(key)
        while len(self._records) > MAX_TRACKED:
            self._records.popitem(last=False)
        if record.deaths >= DEATHS_TO_REFUSE:
            if record.refused_until_s is None:
                self.quarantined_total += 1
            record.refused_until_s = now + self.quarantine_s
            return False
        return True

    def quarantined(self) -> int:
        """Bodies refused now."""
        now = self._clock()
        return sum(
            1
            for r in self._records.values()
            if r.refused_until_s is not None and r.refused_until_s > now
        )
