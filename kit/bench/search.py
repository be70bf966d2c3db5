"""Goodput by search: the highest offered rate whose SLO attainment meets the target.

DistServe finds it by bisection in a simulator; here each probe is a real load point, which
meets when its attainment does and its queue stays steady (`PointSummary.meets`: a finite point
above what the deployment sustains can attain the target while its TTFT climbs). From
`start` the rate doubles while points meet (halves while they do not, down to `floor`), then
bisects between the last rate that met and the first that missed until they are
within `tolerance` of each other. The boundary rate is then run `repeat` more times: the
result says how many of those runs met the target, which is how confident the number is on a
noisy machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kit.bench.metrics import PointSummary
from kit.topology.schema import SLO


@dataclass(frozen=True)
class SearchSpec:
    """Where to start (requests/s), how close to get (relative), how often to repeat the
    boundary, and bounds on the rates and on the probes."""

    start: float = 1.0
    tolerance: float = 0.1
    repeat: int = 2
    floor: float = 0.05
    ceiling: float = 1024.0
    max_points: int = 14


@dataclass
class SearchResult:
    """`goodput` (requests/s, 0 when even the floor missed); `boundary` the runs at it."""

    goodput: float
    met_below: float | None
    missed_above: float | None
    boundary: list[PointSummary] = field(default_factory=list)
    points: list[PointSummary] = field(default_factory=list)
    capped: str = ""
    """Why the search stopped short of the boundary (probe budget, rate ceiling), if it did."""

    @property
    def confirmed(self) -> int:
        return sum(1 for p in self.boundary if p.attainment_met)

    def describe(self, slo: SLO) -> str:
        if self.goodput <= 0:
            return (
                f"no rate down to {self.points[-1].label if self.points else '?'} met "
                f"{slo.attainment:.0%} attainment of TTFT <= {slo.ttft_ms:g} ms and TPOT <= "
                f"{slo.tpot_ms:g} ms"
            )
        runs = ", ".join(f"{p.attainment:.1%}" for p in self.boundary)
        above = f"; {self.missed_above:g} req/s missed" if self.missed_above else ""
        return (
            f"goodput {self.goodput:g} req/s: attainment {runs} over {len(self.boundary)} run(s) "
            f"({self.confirmed} of {len(self.boundary)} met {slo.attainment:.0%} with a steady "
            f"queue){above}" + (f" [{self.capped}]" if self.capped else "")
        )


async def search_goodput(
    measure: Callable[[float], Awaitable[PointSummary]], slo: SLO, spec: SearchSpec
) -> SearchResult:
    """Run points through `measure(rate)` until the boundary is found (see the module doc)."""
    points: list[PointSummary] = []

    async def meets(rate: float) -> bool:
        summary = await measure(rate)
        summary.attainment_met = summary.meets(slo)
        points.append(summary)
        return summary.attainment_met

    good: float | None = None
    bad: float | None = None
    rate = spec.start
    capped = ""
    while len(points) < spec.max_points:
        if await meets(rate):
            good = rate
            if bad is not None:
                break
            if rate >= spec.ceiling:
                capped = f"met at the ceiling {spec.ceiling:g} req/s"
                break
            rate = min(rate * 2, spec.ceiling)
        else:
            bad = rate
            if good is not None:
                break
            if rate / 2 < spec.floor:
                break
            rate /= 2
    while (
        good is not None
        and bad is not None
        and (bad - good) > spec.tolerance * good
        and len(points) < spec.max_points
    ):
        mid = round((good + bad) / 2, 4)
        if await meets(mid):
            good = mid
        else:
            bad = mid
    if good is not None and bad is not None and (bad - good) > spec.tolerance * good:
        capped = capped or f"stopped after {spec.max_points} points"
    result = SearchResult(good or 0.0, good, bad, points=points, capped=capped)
    if good is not None:
        result.boundary = [p for p in points if p.rate == good][-1:]
        for _ in range(spec.repeat):
            await meets(good)
            result.boundary.append(points[-1])
    return result
