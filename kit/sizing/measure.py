"""Goodput of one deployment in virtual time: the rate search every sizing candidate goes
through, and the workload it is measured with.

A point serves the workload at one rate on `kit.perf`'s cluster model (the sim worker's own
scheduler and timing, on a virtual clock) and checks the SLO attainment and that the queue stays
steady (`kit.perf.sweep`); the goodput is the highest rate where both hold (DistServe's
bisection). Two things make it cheap enough to run for every candidate:

* the search starts from an estimate (a role's measured capacity times its instances) and
  steps geometrically from there, so a good estimate costs 4-6 points instead of 10-15;
* points are cached by (cluster, rate), so a cluster measured once is never served again.

Short runs flatter a fast deployment: at 200 req/s, 200 requests arrive within one second, less
than one request's life, and the batch never reaches its steady size. A point therefore serves
at least `SteadyWorkload.lifetimes` request lifetimes of arrivals (a lifetime being the SLO's
TTFT plus output length x TPOT), more requests than the workload's count when the rate asks for
it (up to `max_requests`). A trace is never extended: it is what it is.

Rates are requests/s and latencies seconds of model time (see `kit.sizing.problem` for the
sim's speed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kit.perf.cluster import Cluster
from kit.perf.sweep import Summary, run_rate
from kit.perf.workload import STEADY_LIFETIMES, Request, WorkloadSpec
from kit.topology.schema import SLO

FLOOR = 0.01
"""Slowest rate tried (requests/s): below it the deployment has no goodput."""
CEILING = 1e5
"""Fastest rate tried (requests/s)."""


@dataclass(frozen=True)
class SteadyWorkload:
    """The workload at a rate, long enough to reach the steady state (see the module doc)."""

    spec: WorkloadSpec
    lifetime_s: float
    lifetimes: float = STEADY_LIFETIMES
    max_requests: int = 4000

    def count(self, rate: float) -> int:
        """Requests served at `rate` (requests/s)."""
        if self.spec.trace:
            return self.spec.count
        steady = math.ceil(rate * self.lifetimes * self.lifetime_s)
        return max(self.spec.count, min(self.max_requests, steady))

    def requests(self, rate: float) -> list[Request]:
        return replace(self.spec, count=self.count(rate)).requests(rate)


@dataclass(frozen=True)
class Goodput:
    """A cluster's goodput (requests/s; 0 when even `FLOOR` misses), the point at that rate
    and the first point above it that missed (None when the search hit `CEILING`)."""

    rate: float
    at: Summary | None
    above: Summary | None


@dataclass
class Meter:
    """Serves clusters at rates, once each, under `slo` unless a call says otherwise;
    `points` counts the points served."""

    workload: SteadyWorkload
    slo: SLO
    tolerance: float = 0.03
    growth: float = 1.1
    """First step (x or /) while the search brackets the goodput: small when estimates are
    good; each further step in the same direction is the square of the last."""
    points: int = 0
    _cache: dict[tuple[Cluster, float, SLO], Summary] = field(default_factory=dict)

    def point(self, cluster: Cluster, rate: float, slo: SLO | None = None) -> Summary:
        """The cluster at `rate` requests/s (cached)."""
        slo = slo or self.slo
        key = (cluster, round(rate, 9), slo)
        found = self._cache.get(key)
        if found is None:
            found = run_rate(cluster, rate, self.workload.requests, slo=slo)
            self._cache[key] = found
            self.points += 1
        return found

    def goodput(self, cluster: Cluster, estimate: float, slo: SLO | None = None) -> Goodput:
        """Highest rate meeting the SLO, to within `tolerance` (relative), searched from
        `estimate` (requests/s): up while it holds, down while it misses, by `growth` and then
        by the square of the last step (a good estimate is bracketed in two points, a poor one
        in few more), then bisected geometrically."""

        def meets(rate: float) -> bool:
            return self.point(cluster, rate, slo).meets(slo or self.slo)

        rate = min(max(estimate, FLOOR), CEILING)
        step = self.growth
        low: float | None = None
        high: float | None = None
        if meets(rate):
            low = rate
            while high is None:
                if low >= CEILING:
                    return Goodput(low, self.point(cluster, low, slo), None)
                up = min(low * step, CEILING)
                if meets(up):
                    low, step = up, step * step
                else:
                    high = up
        else:
            high = rate
            while low is None:
                down = high / step
                if down < FLOOR:
                    return Goodput(0.0, None, self.point(cluster, high, slo))
                if meets(down):
                    low = down
                else:
                    high, step = down, step * step
        while high / low > 1 + self.tolerance:
            mid = math.sqrt(low * high)
            if meets(mid):
                low = mid
            else:
                high = mid
        return Goodput(low, self.point(cluster, low, slo), self.point(cluster, high, slo))
