"""Virtual-time sweeps: serve a workload on a `Cluster` at given request rates and measure
latency percentiles, SLO attainment and goodput.

The SLO is the topology's (`kit.topology.schema.SLO`: milliseconds and a share); summaries
give latencies in milliseconds. Goodput is the highest request rate at which at least
``slo.attainment`` of the requests meet both latency targets (DistServe, OSDI'24) and the queue
stays steady, found by bisection.

A steady queue: a finite run slightly above what a cluster sustains still attains the target,
because its first requests find an empty queue; its TTFT climbs through the run instead. A run
whose TTFT p50 over the last third of its requests (in arrival order) is at least
`QUEUE_GROWTH` x that of the first third, and higher by `QUEUE_GROWTH_SLO` x the TTFT objective
or more, has a growing queue and does not count as met, however many requests attained the SLO.
`pdkit bench --search` applies the same rule to the measured points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kit.perf.cluster import Cluster, Kind, Outcome
from kit.perf.workload import WorkloadFactory
from kit.topology.schema import SLO

MS = 1000.0  # model seconds to milliseconds

QUEUE_GROWTH = 2.0
"""TTFT p50 growth (last third / first third) that marks a growing queue."""
QUEUE_GROWTH_SLO = 0.1
"""...and the least rise (share of the TTFT objective) that does: noise at low TTFT is not."""


@dataclass(frozen=True)
class Summary:
    """One run at one rate: the offered `rate` (requests/s), TTFT and TPOT percentiles (ms;
    infinite when more than that share of requests failed), the share of requests that met
    the SLO (0..1) and the number of requests."""

    rate: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    attainment: float
    requests: int
    growing: bool = False
    """The queue grew through the run (see the module doc): the rate is not sustained."""

    def meets(self, slo: SLO) -> bool:
        """Attainment at least the target, with a steady queue."""
        return self.attainment >= slo.attainment and not self.growing


def ttft_trend(ttfts_ms: Sequence[float]) -> tuple[float, float] | None:
    """TTFT p50 (ms) of the first and of the last third of the answered requests, given in
    arrival order (infinite ones, failures, left out); None for fewer than 9."""
    answered = [t for t in ttfts_ms if math.isfinite(t)]
    if len(answered) < 9:
        return None
    third = len(answered) // 3
    return percentile(answered[:third], 0.5), percentile(answered[-third:], 0.5)


def queue_growing(trend: tuple[float, float] | None, slo: SLO) -> bool:
    """Whether a run's TTFT trend (`ttft_trend`) marks a growing queue (see the module doc)."""
    if trend is None:
        return False
    first, last = trend
    return last >= QUEUE_GROWTH * max(first, 1.0) and last - first >= QUEUE_GROWTH_SLO * slo.ttft_ms


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0..1) by nearest rank (nan for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def meets_slo(kind: Kind, outcome: Outcome, slo: SLO) -> bool:
    """Whether one request met the SLO: TTFT only on a prefill-only instance, both otherwise.
    On a decode-only instance the TTFT is the wait for a decode slot (the KV is there at once),
    which is what bounds its rate once its KV room is full."""
    ttft_ok = outcome.ttft_s <= slo.ttft_ms / MS
    return ttft_ok if kind == "prefill-only" else ttft_ok and outcome.tpot_s <= slo.tpot_ms / MS


def summarize(kind: Kind, rate: float, outcomes: Sequence[Outcome], slo: SLO) -> Summary:
    """Percentiles and SLO attainment of one run's outcomes (see `meets_slo`)."""
    ttfts = [o.ttft_s * MS for o in outcomes]
    tpots = [o.tpot_s * MS for o in outcomes]
    met = sum(1 for o in outcomes if meets_slo(kind, o, slo))
    return Summary(
        rate=rate,
        p50_ttft_ms=percentile(ttfts, 0.5),
        p90_ttft_ms=percentile(ttfts, 0.9),
        p50_tpot_ms=percentile(tpots, 0.5),
        p90_tpot_ms=percentile(tpots, 0.9),
        attainment=met / len(outcomes) if outcomes else 0.0,
        requests=len(outcomes),
        growing=queue_growing(ttft_trend(ttfts), slo),
    )


def run_rate(cluster: Cluster, rate: float, workload: WorkloadFactory, *, slo: SLO) -> Summary:
    """Serve `workload(rate)` (rate in requests/s) on `cluster` and summarize it."""
    return summarize(cluster.kind, rate, cluster.run(workload(rate)), slo)


def goodput(
    cluster: Cluster,
    workload: WorkloadFactory,
    *,
    slo: SLO,
    low: float = 0.05,
    high: float = 16.0,
    ceiling: float = 4096.0,
    tolerance: float = 0.02,
) -> float:
    """Highest request rate (requests/s) whose SLO attainment stays >= `slo.attainment` with a
    steady queue, by bisection to within `tolerance` (relative): 0 when even `low` misses,
    `ceiling` when even that meets the SLO. Divide by `cluster.gpus` for goodput per GPU."""

    def meets(rate: float) -> bool:
        return run_rate(cluster, rate, workload, slo=slo).meets(slo)

    if not meets(low):
        return 0.0
    while meets(high):
        if high >= ceiling:
            return ceiling
        low, high = high, high * 2
    while high - low > tolerance * low:
        mid = (low + high) / 2
        low, high = (mid, high) if meets(mid) else (low, mid)
    return low


def rate_grid(start: float, stop: float, count: int) -> list[float]:
    """`count` rates evenly spaced from `start` to `stop` (requests/s), rounded to 0.01."""
    step = (stop - start) / max(count - 1, 1)
    return sorted({round(start + i * step, 2) for i in range(count)})
