"""The poison-request rule: one request must not take down more than one server.

SGLang 0.5.23 dies on some requests instead of refusing them (an input id outside the
vocabulary kills the whole server in the prefill's embedding; `kit.lb.validate` refuses the
ones known, this rule bounds the others). A retry on a fresh pair would send such a request to
the next prefill, and the next. The prefill is the first worker that runs anything of a request
(its prompt's forward pass and its first sampling step), so a prefill is where a request that
kills shows itself; a decode that dies after the prefill served the request is not suspected
(its streams are migrated, `kit.lb.migrate`).

A request's life under the rule (`kit.lb.dispatch` drives it; this module keeps the books):

1. Its prefill leg loses its connection after the request was sent: the router probes that
   prefill at once (`Dispatcher`'s probe, the health path). One that answers is alive: the
   death was not a death, and the request is retried on a fresh pair as any failure.
2. A prefill found dead makes the request a suspect (`PoisonGuard.died`): it is not sent to
   another worker. It waits for the dead prefill to be alive again (probed every
   `PROBE_EVERY` s, up to --hold-timeout within the retry deadline) and is then sent to that
   same prefill: an innocent request is served, a poison one kills only the server it killed
   already. A prefill that does not come back in time ends the request with a 502 that says
   why (cause `poison_suspect`).
3. A suspect body (the same route and bytes) sent again by a client goes the same way: only to
   the prefill it was on, once that is alive.
4. A second death under the same body makes it poison (`quarantined`): refused at once, and
   for `quarantine_s`, with a 502 naming its fingerprint (cause `poison_refused`).
5. A suspect served well is cleared.

Bodies are matched by a SHA-256 fingerprint of route and bytes, so nothing of a prompt is
kept; at most `MAX_TRACKED` are remembered, the oldest forgotten first, and a record older than
`quarantine_s` is dropped. Counted in /metrics (`pdkit_lb_poison_*`), named in the access log
(`poison`: the fingerprint of a suspect or refused request).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kit.lb.errors import ApiError

DEATHS_TO_REFUSE = 2
"""Deaths under one body after which it is refused: the first is retried (on the same
prefill, once alive), the second is not."""
QUARANTINE_S = 600.0
"""Seconds a body that killed twice stays refused (and a first death is remembered)."""
MAX_TRACKED = 4096
"""Bodies remembered at once; the oldest are forgotten first."""
PROBE_EVERY = 0.2
"""Seconds between probes of a dead prefill that suspects wait for."""


def fingerprint(path: str, body: bytes) -> str:
    """The key of a request: the SHA-256 of its route and body, hex, first 16 characters."""
    digest = hashlib.sha256(path.encode())
    digest.update(b"\0")
    digest.update(body)
    return digest.hexdigest()[:16]


@dataclass
class _Record:
    deaths: int
    worker: str  # the prefill that died under it (the last one)
    last_s: float
    refused_until_s: float | None = None


class PoisonGuard:
    """Deaths of prefills under request bodies: which bodies are suspects (sent only to the
    prefill they were on) and which are refused. Times are the clock's seconds."""

    def __init__(
        self,
        *,
        quarantine_s: float = QUARANTINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quarantine_s = quarantine_s
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self.suspects_total = 0  # requests whose prefill was found dead under them
        self.refused_total = 0  # requests refused (a poison body, a suspect's prefill not back)
        self.quarantined_total = 0  # bodies found poison (a second death)
        self.cleared_total = 0  # suspects served well afterwards

    def __bool__(self) -> bool:
        """Whether any body is remembered (else arrivals need no fingerprint)."""
        return bool(self._records)

    def _record(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is not None and self._clock() - record.last_s > self.quarantine_s:
            del self._records[key]
            return None
        return record

    def pinned(self, key: str) -> str | None:
        """The prefill a suspect body may go to (None: any); raises the refusal of a poison
        body (ApiError 502, counted)."""
        record = self._record(key)
        if record is None:
            return None
        if record.refused_until_s is not None:
            self.refused_total += 1
            left = max(0.0, record.refused_until_s - self._clock())
            raise ApiError(
                502,
                f"request refused: a prefill died {record.deaths} times while serving this same "
                f"request (a poison request, fingerprint {key}); pdkit's router refuses it for "
                f"{left:.0f} s more. Check it against the model (ids in the vocabulary, "
                "lengths, sampling parameters) and the workers' logs",
                "poison_refused",
            )
        return record.worker

    def died(self, key: str, worker: str) -> bool:
        """Prefill `worker` was found dead under the body `key`: True while it is a suspect
        (retried on that prefill once alive), False when this death makes it refused."""
        now = self._clock()
        record = self._record(key)
        if record is None:
            record = self._records[key] = _Record(0, worker, now)
            self.suspects_total += 1
        record.deaths += 1
        record.worker = worker
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

    def served(self, key: str) -> None:
        """A suspect body was served well: it is cleared."""
        record = self._records.get(key)
        if record is not None and record.refused_until_s is None:
            del self._records[key]
            self.cleared_total += 1

    def not_back(self, key: str, worker: str, waited_s: float) -> ApiError:
        """The 502 for a suspect whose prefill did not come back in time (counted)."""
        self.refused_total += 1
        return ApiError(
            502,
            f"prefill worker {worker} died while serving this request and was not back within "
            f"{waited_s:g} s; pdkit's router does not send it to another worker, since the "
            f"request may be what killed it (fingerprint {key}). Send it again once that worker "
            "is back (pdkit status); a second death under it makes it refused",
            "poison_suspect",
            headers={"Retry-After": "5"},
        )

    def poisoned(self, key: str) -> ApiError:
        """The 502 for a request whose second death just made it refused (counted)."""
        self.refused_total += 1
        return ApiError(
            502,
            f"request refused: a prefill died {DEATHS_TO_REFUSE} times while serving this "
            f"request (a poison request, fingerprint {key}); pdkit's router refuses it for "
            f"{self.quarantine_s:.0f} s. Check it against the model (ids in the vocabulary, "
            "lengths, sampling parameters) and the workers' logs",
            "poison_refused",
        )

    def counts(self) -> tuple[int, int]:
        """(bodies suspected now, bodies refused now)."""
        now = self._clock()
        refused = sum(
            1
            for r in self._records.values()
            if r.refused_until_s is not None and r.refused_until_s > now
        )
        return len(self._records) - refused, refused
