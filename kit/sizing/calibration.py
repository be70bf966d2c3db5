"""Calibration: fit the timing model's efficiency factors to what a deployment measured, and
keep them for the next `pdkit size`.

A `pdkit bench` run leaves every request in `requests.jsonl`: when it was sent, its lengths,
its TTFT and TPOT. Each load point is replayed in virtual time on the deployment's own
instances (read from its Plan the way `pdkit bench`'s prediction reads them, at the sim's
speed), with the very arrivals and lengths that were sent, and the model's P50 and P90 TTFT and
TPOT are compared with the measured ones. The fit moves each factor of
`kit.perf.timing.Efficiency` to minimise the mean squared log error, over the points, of the
latencies it governs: compute (the prefills) those of TTFT, memory (the decode steps) those of
TPOT (golden-section search on each factor in turn). Points where fewer than half the requests
met the SLO are left out: an overloaded queue says more about the run's length than about the
GPUs.

The fit is stored per (model shape, GPU) in a JSON file (`store_path`), which `pdkit size` reads.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kit.bench.records import RequestRecord, read_records
from kit.perf.cluster import Cluster, Instances
from kit.perf.sweep import goodput, percentile
from kit.perf.timing import Efficiency
from kit.perf.workload import Request
from kit.sizing.problem import SizingError
from kit.topology.schema import SLO

CALIBRATION_ENV = "PDKIT_CALIBRATION"
"""A file to keep calibrations in instead of the default (`store_path`)."""
STORE_VERSION = 1
BOUNDS = (0.05, 1.0)
"""Efficiencies searched: a twentieth of peak to peak."""
MIN_ATTAINMENT = 0.5
METRICS = ("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms")


@dataclass(frozen=True)
class Calibration:
    """Efficiency factors fitted for one model shape on one GPU type, and where from."""

    model: str
    gpu: str
    compute: float
    memory: float
    run: str
    fitted_at: str
    error_before: float
    error_after: float

    @property
    def efficiency(self) -> Efficiency:
        return Efficiency(compute=self.compute, memory=self.memory)

    def describe(self) -> str:
        return (
            f"compute {self.compute:.3f}, memory {self.memory:.3f} (calibrated on {self.run}, "
            f"{self.fitted_at})"
        )


def store_path(env: dict[str, str] | None = None) -> Path:
    """`$PDKIT_CALIBRATION`, else `$XDG_CONFIG_HOME/pdkit/calibration.json`, else
    `~/.config/pdkit/calibration.json`."""
    env = dict(os.environ) if env is None else env
    if env.get(CALIBRATION_ENV):
        return Path(env[CALIBRATION_ENV]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "pdkit" / "calibration.json"


def _read_store(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        entries = data["calibrations"]
        if not isinstance(entries, list):
            raise TypeError("calibrations is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SizingError(
            f"{path}: not a pdkit calibration file ({exc}). To fix: remove it (the next "
            f"--calibrate writes a new one), or point {CALIBRATION_ENV} elsewhere."
        ) from exc
    return entries


def load(model: str, gpu: str, path: Path) -> Calibration | None:
    """The calibration stored for `model` on `gpu`, if any."""
    for entry in _read_store(path):
        if entry.get("model") == model and entry.get("gpu") == gpu:
            try:
                return Calibration(**entry)
            except TypeError as exc:
                raise SizingError(f"{path}: a calibration entry is malformed ({exc}).") from exc
    return None


def save(calibration: Calibration, path: Path) -> None:
    """Store `calibration`, replacing the one for the same model and GPU."""
    entries = [
        e
        for e in _read_store(path)
        if (e.get("model"), e.get("gpu")) != (calibration.model, calibration.gpu)
    ]
    entries.append(asdict(calibration))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"version": STORE_VERSION, "calibrations": entries}, indent=2) + "\n"
        )
    except OSError as exc:
        raise SizingError(f"{path}: cannot write the calibration ({exc.strerror}).") from exc


# -- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPoint:
    """One load point of a bench run: its offered rate and its requests, in send order."""

    rate: float
    records: tuple[RequestRecord, ...]

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]


@dataclass(frozen=True)
class BenchRun:
    """What a `pdkit bench --out DIR` run left: its points, SLO and measured goodput."""

    folder: Path
    points: tuple[RunPoint, ...]
    slo: SLO
    goodput: float | None
    deployment: dict[str, Any] | None = None
    """What the run measured (`kit.bench.run.deployment_json`); None for a `--url` run."""

    def mismatch(self, measured: dict[str, Any]) -> list[str]:
        """How `measured` (the topology's `deployment_json`) differs from what the run
        measured, one phrase per difference; empty when it is the same or not recorded."""
        ran = self.deployment
        if not ran:
            return []
        out = []
        if ran.get("model") != measured["model"]:
            out.append(f"model {ran.get('model')} -> {measured['model']}")
        for role in ("prefill", "decode"):
            was, now = (ran.get("roles") or {}).get(role) or {}, measured["roles"].get(role) or {}
            for key in sorted(set(was) | set(now)):
                if was.get(key) != now.get(key):
                    out.append(f"{role} {key} {was.get(key)} -> {now.get(key)}")
        return out


def read_run(folder: Path) -> BenchRun:
    """The run in `folder` (summary.json and requests.jsonl); `SizingError` naming what is
    missing or unreadable."""
    summary_path, records_path = folder / "summary.json", folder / "requests.jsonl"
    for path in (summary_path, records_path):
        if not path.is_file():
            raise SizingError(
                f"--calibrate {folder}: no {path.name}. To fix: give the --out folder of a "
                "`pdkit bench TOPOLOGY --search --out DIR` run."
            )
    try:
        summary = json.loads(summary_path.read_text())
        slo = SLO(**summary["slo"])
        records = list(read_records(records_path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SizingError(f"--calibrate {folder}: cannot read the run ({exc}).") from exc
    points: list[RunPoint] = []
    current: list[RequestRecord] = []
    for record in records:  # a point's indices start at 0
        if current and record.index <= current[-1].index:
            points.append(_point(current))
            current = []
        current.append(record)
    if current:
        points.append(_point(current))
    rated = tuple(p for p in points if p.rate > 0)
    if not rated:
        raise SizingError(
            f"--calibrate {folder}: no load point at a rate (a closed loop cannot be "
            "replayed). To fix: bench with --search or --rates."
        )
    search = summary.get("search") or {}
    measured = search.get("goodput") if search and not search.get("capped") else None
    deployment = summary.get("deployment")
    return BenchRun(
        folder,
        rated,
        slo,
        float(measured) if measured else None,
        deployment if isinstance(deployment, dict) else None,
    )


def _point(records: list[RequestRecord]) -> RunPoint:
    return RunPoint(records[0].rate or 0.0, tuple(records))


# -- the fit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latencies:
    """P50/P90 TTFT and TPOT of one point's measured requests (wall ms)."""

    p50_ttft_ms: float
    p90_ttft_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float

    @classmethod
    def of(cls, ttft: Sequence[float], tpot: Sequence[float]) -> Latencies:
        return cls(
            percentile(ttft, 0.5),
            percentile(ttft, 0.9),
            percentile(tpot, 0.5),
            percentile(tpot, 0.9),
        )

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, m) for m in METRICS)


def with_efficiency(cluster: Cluster, efficiency: Efficiency) -> Cluster:
    """`cluster` with every instance timed at `efficiency`."""

    def group(instances: Instances | None) -> Instances | None:
        if instances is None:
            return None
        return replace(instances, config=replace(instances.config, efficiency=efficiency))

    return replace(
        cluster,
        colocated=group(cluster.colocated),
        prefill=group(cluster.prefill),
        decode=group(cluster.decode),
    )


def measured_latencies(point: RunPoint) -> Latencies | None:
    """The point's measured percentiles, from its answered requests (None: none answered)."""
    answered = [r for r in point.measured if r.ok and r.ttft_ms is not None]
    if not answered:
        return None
    return Latencies.of([r.ttft_ms or 0.0 for r in answered], [r.tpot_ms or 0.0 for r in answered])


def replay(cluster: Cluster, speed: float, point: RunPoint) -> Latencies:
    """The model's percentiles for the point's requests, sent when they were sent (wall ms;
    the sim's model time runs at `speed` x wall time)."""
    requests = [Request(r.sent_s * speed, r.input_tokens, r.output_tokens) for r in point.records]
    outcomes = cluster.run(requests)
    answered = [
        (o.ttft_s, o.tpot_s)
        for o, r in zip(outcomes, point.records, strict=True)
        if not r.warmup and r.ok and r.ttft_ms is not None
    ]
    scale = 1000 / speed
    return Latencies.of([t * scale for t, _ in answered], [p * scale for _, p in answered])


def usable(run: BenchRun) -> list[tuple[RunPoint, Latencies]]:
    """The points the fit uses (see the module doc), with their measured latencies."""
    out = []
    for point in run.points:
        measured = point.measured
        latencies = measured_latencies(point)
        if latencies is None or not measured:
            continue
        met = sum(1 for r in measured if r.meets(run.slo)) / len(measured)
        if met >= MIN_ATTAINMENT:
            out.append((point, latencies))
    return out


FITS = {"compute": ("p50_ttft_ms", "p90_ttft_ms"), "memory": ("p50_tpot_ms", "p90_tpot_ms")}
"""Each factor and the latencies it is fitted to: compute times the prefills behind TTFT,
memory the decode steps behind TPOT."""


def log_error(predicted: Latencies, measured: Latencies, metrics: Sequence[str]) -> float:
    """Mean squared log ratio of the `metrics` percentiles (0: a perfect match)."""
    pairs = [(getattr(predicted, k), getattr(measured, k)) for k in metrics]
    pairs = [(p, m) for p, m in pairs if m > 0]
    return sum(math.log(max(p, 1e-9) / m) ** 2 for p, m in pairs) / max(len(pairs), 1)


def mape(predicted: Latencies, measured: Latencies) -> float:
    """Mean absolute percentage error of the four percentiles (0.1: 10%)."""
    pairs = [(p, m) for p, m in zip(predicted.values(), measured.values(), strict=True) if m > 0]
    return sum(abs(p / m - 1) for p, m in pairs) / max(len(pairs), 1)


@dataclass(frozen=True)
class PointFit:
    """One point: measured, predicted before and after (wall ms)."""

    rate: float
    measured: Latencies
    before: Latencies
    after: Latencies


@dataclass(frozen=True)
class Fit:
    before: Efficiency
    after: Efficiency
    points: tuple[PointFit, ...]

    @property
    def error_before(self) -> float:
        """Mean absolute percentage error of the latencies before the fit (0.1: 10%)."""
        return sum(mape(p.before, p.measured) for p in self.points) / len(self.points)

    @property
    def error_after(self) -> float:
        return sum(mape(p.after, p.measured) for p in self.points) / len(self.points)


def golden_section(loss: Callable[[float], float], low: float, high: float, tol: float) -> float:
    """Minimiser of a unimodal `loss` on [low, high] (log space), to `tol` (log units)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(low), math.log(high)
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(math.exp(c)), loss(math.exp(d))
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(math.exp(d))
    return math.exp((a + b) / 2)


def fit(
    cluster: Cluster,
    speed: float,
    points: Sequence[tuple[RunPoint, Latencies]],
    start: Efficiency | None = None,
    rounds: int = 2,
) -> Fit:
    """Fit the efficiency factors of `cluster` (see the module doc) from `start` (default:
    kit/perf's)."""
    instances = cluster.prefill or cluster.decode or cluster.colocated
    start = start or (Efficiency.for_gpu(instances.config.gpu) if instances else Efficiency())
    if not points:
        raise SizingError(
            "no load point of the run has half its requests within the SLO, so there is "
            "nothing the model should match. To fix: bench at lower rates (--rates) or with "
            "--search."
        )
    cache: dict[tuple[float, float], list[Latencies]] = {}

    def predicted(efficiency: Efficiency) -> list[Latencies]:
        key = (round(efficiency.compute, 4), round(efficiency.memory, 4))
        if key not in cache:
            timed = with_efficiency(cluster, efficiency)
            cache[key] = [replay(timed, speed, p) for p, _ in points]
        return cache[key]

    def along(fixed: Efficiency, factor: str) -> Callable[[float], float]:
        def loss(value: float) -> float:
            replayed = predicted(replace(fixed, **{factor: value}))
            return sum(
                log_error(r, m, FITS[factor]) for r, (_, m) in zip(replayed, points, strict=True)
            )

        return loss

    current = start
    for _ in range(rounds):  # the factors barely interact: a second round settles them
        for factor in FITS:
            best = golden_section(along(current, factor), *BOUNDS, 0.02)
            current = replace(current, **{factor: best})
    before, after = with_efficiency(cluster, start), with_efficiency(cluster, current)
    return Fit(
        start,
        current,
        tuple(
            PointFit(p.rate, m, replay(before, speed, p), replay(after, speed, p))
            for p, m in points
        ),
    )


def predicted_goodput(
    cluster: Cluster, speed: float, run: BenchRun, efficiency: Efficiency
) -> float:
    """The model's goodput (wall requests/s) for the run's own requests at `efficiency`: the
    first point's lengths and schedule, its gaps scaled to each rate as `pdkit bench` scales
    them (by the offered rate, not by the rate the sample happened to realise)."""
    first = run.points[0]
    schedule = [(r.scheduled_s, r.input_tokens, r.output_tokens) for r in first.records]

    def at(model_rate: float) -> list[Request]:
        # The point ran at first.rate wall requests/s, that is first.rate / speed in model
        # time, with model arrivals scheduled_s x speed.
        stretch = first.rate / model_rate
        return [Request(t * stretch, prompt, output) for t, prompt, output in schedule]

    slo = SLO(
        ttft_ms=run.slo.ttft_ms * speed,
        tpot_ms=run.slo.tpot_ms * speed,
        attainment=run.slo.attainment,
    )
    return goodput(with_efficiency(cluster, efficiency), at, slo=slo) * speed


def stamp() -> str:
    """Today, for `Calibration.fitted_at`."""
    return time.strftime("%Y-%m-%d")
