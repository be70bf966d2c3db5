"""Prometheus text exposition: parse it once, then ask for sums, histograms and rates.

Workers (`sglang:*` on the HTTP port), pdkit's load balancer (`/metrics` on its port) and smg
(`smg_*` on its Prometheus port) all speak this format. Parsing uses prometheus_client's own
parser; everything else here is plain arithmetic on the samples, with Prometheus' semantics
(`histogram_quantile` interpolation, counter resets).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from kit.errors import ProbeError

INF = math.inf


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: `name{labels} value`."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram, summed over every series that matched.

    `buckets` are (upper bound, cumulative count) pairs sorted by bound, the last bound +Inf;
    `count` and `sum` are in the metric's unit (seconds for `*_seconds`).
    """

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1), interpolated like Prometheus' histogram_quantile.

        None when the histogram holds no observation. A quantile that falls in the +Inf bucket
        is reported as the largest finite bound (a lower bound of the truth).
        """
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if bound == INF:
                    return lower
                if bound <= 0:
                    return bound
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower

    def share_at_most(self, limit: float) -> float | None:
        """Estimated share (0..1) of observations <= `limit`, interpolated within its bucket."""
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0:
            return None
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if limit <= bound:
                if bound == INF or bound <= lower:
                    return below / total
                inside = (cumulative - below) * (limit - lower) / (bound - lower)
                return min(1.0, (below + max(0.0, inside)) / total)
            lower, below = bound, cumulative
        return below / total

    def since(self, earlier: Histogram | None) -> Histogram:
        """Observations made after `earlier` was taken (itself after a reset or bucket change)."""
        if earlier is None or earlier.count > self.count:
            return self
        if [b for b, _ in earlier.buckets] != [b for b, _ in self.buckets]:
            return self
        return Histogram(
            buckets=tuple(
                (bound, now - before)
                for (bound, now), (_, before) in zip(self.buckets, earlier.buckets, strict=True)
            ),
            count=self.count - earlier.count,
            sum=self.sum - earlier.sum,
        )


class MetricSet:
    """Samples of one scrape, looked up by sample name (e.g. `x_total`, `x_bucket`)."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self._by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            self._by_name.setdefault(sample.name, []).append(sample)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    def samples(self, name: str, **match: str) -> list[Sample]:
        """Samples called `name` whose labels include every `match` pair."""
        return [
            s
            for s in self._by_name.get(name, [])
            if all(s.labels.get(k) == v for k, v in match.items())
        ]

    def total(self, name: str, **match: str) -> float | None:
        """Sum over the matching series; None when there is none (not the same as 0)."""
        found = [s.value for s in self.samples(name, **match) if not math.isnan(s.value)]
        return math.fsum(found) if found else None

    def maximum(self, name: str, **match: str) -> float | None:
        found = [s.value for s in self.samples(name, **match) if not math.isnan(s.value)]
        return max(found) if found else None

    def first_total(self, names: Iterable[str], **match: str) -> float | None:
        """`total` of the first of `names` that is exposed (for renamed metrics)."""
        for name in names:
            value = self.total(name, **match)
            if value is not None:
                return value
        return None

    def histogram(self, name: str, **match: str) -> Histogram | None:
        """The histogram family `name` (without suffix), summed over matching series."""
        by_bound: dict[float, float] = {}
        for sample in self.samples(f"{name}_bucket", **match):
            try:
                bound = float(sample.labels.get("le", "nan"))
            except ValueError:
                continue
            if not math.isnan(bound):
                by_bound[bound] = by_bound.get(bound, 0.0) + sample.value
        if not by_bound:
            return None
        buckets = sorted(by_bound.items())
        if buckets[-1][0] != INF:  # malformed, but keep the data usable
            buckets.append((INF, buckets[-1][1]))
        count = self.total(f"{name}_count", **match)
        return Histogram(
            buckets=tuple(buckets),
            count=buckets[-1][1] if count is None else count,
            sum=self.total(f"{name}_sum", **match) or 0.0,
        )


_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum")


def _family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def select_families(text: str, families: Collection[str]) -> str:
    """Only the lines of `families` (names without the _bucket/_sum/_count/_total suffixes).

    A large server exposes thousands of samples of which status reads a few dozen; dropping
    the rest with string tests first keeps the (slow, exact) parser's work small.
    """
    wanted = {_family(f) for f in families}
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP", "UNIT") and parts[2] in wanted:
                kept.append(line)
            continue
        name = (line.split("{", 1)[0].split(None, 1) or [""])[0]
        if name in wanted or _family(name) in wanted:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(text: str, families: Collection[str] | None = None) -> MetricSet:
    """Parse Prometheus text (only `families`, when given); raise ProbeError when the text is
    not the exposition format."""
    if families is not None:
        selected = select_families(text, families)
        if selected.strip() or not text.strip():
            return _parse(selected)
        _parse("\n".join(text.splitlines()[:20]) + "\n")  # raises when it is not the format
        return MetricSet(())
    return _parse(text)


@functools.lru_cache(maxsize=2048)
def _parse(text: str) -> MetricSet:
    # Cached: `--watch` evaluates each scrape twice (as "now", then as "earlier").
    try:
        return MetricSet(
            Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        )
    except (ValueError, TypeError, IndexError) as exc:
        first = text.strip().splitlines()[0][:60] if text.strip() else "(empty)"
        raise ProbeError(f"not Prometheus text (starts {first!r})") from exc


def increase(now: float | None, before: float | None) -> float | None:
    """A counter's increase between two scrapes; a drop means a restart (count from zero)."""
    if now is None:
        return None
    if before is None:
        return None
    return now if now < before else now - before


def rate(now: float | None, before: float | None, seconds: float) -> float | None:
    """Per-second increase of a counter over `seconds` (None without two samples)."""
    grown = increase(now, before)
    if grown is None or seconds <= 0:
        return None
    return grown / seconds
