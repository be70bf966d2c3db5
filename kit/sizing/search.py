"""The search: which deployment serves the most within the SLO on the hosts (or, with a target
rate, which serves that rate on the fewest GPUs).

1. Capacities (`kit.sizing.capacity`): what prefill instances of each role option sustain
   (one, and two behind round-robin, served in virtual time), what a decode instance sustains
   (its steady batch within the TPOT, worked out), and each colocated option's goodput.
2. Estimates: a PD *unit* is `a` prefill and `b` decode instances of one option each (a + b <=
   `MAX_UNIT_INSTANCES`, a and b coprime); its estimate is ``min(prefill(a), b x decode)``
   (DistServe's and aiconfigurator's rate matching, with what `a` prefills sustain together).
   A deployment is `copies` of a unit behind the round-robin router: as many as the GPUs hold,
   or as the target rate needs. Every unit is estimated (arithmetic, no simulation).
3. Verification: the best deployments by estimate that the validator accepts
   (`kit.sizing.accept`: placement on the hosts, SGLang's rules) have their unit served in
   virtual time with the workload's own arrivals and lengths and its goodput searched; a
   deployment's goodput is its copies x its unit's. `verify` units are served (all of them
   with `exhaustive`), results are cached, and colocated deployments come from stage 1 as they
   are.

Ranked by goodput (then fewer GPUs), or with a target by GPUs (then goodput). Rates in the
result are wall requests/s of the deployment (the sim's speed applied, see
`kit.sizing.problem`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from kit.perf.sweep import Summary
from kit.sizing.accept import accepted
from kit.sizing.candidates import Deployment, Group, instance_config, with_knobs
from kit.sizing.capacity import Capacities, better, decode_batch, measure
from kit.sizing.measure import Meter, SteadyWorkload
from kit.sizing.problem import SizingError, SizingProblem

MAX_UNIT_INSTANCES = 8
"""Instances in a PD unit at most; larger deployments are copies of a unit."""
VERIFY = 4
"""Units served in virtual time by a pruned search (the best by estimate)."""
BALANCED = 0.1
"""Prefill and decode capacities within this share of each other: neither is the bottleneck."""


@dataclass(frozen=True)
class Rated:
    """A deployment and what the model says of it. `goodput` and `estimate` are wall
    requests/s of the whole deployment; `at` is its unit's point at the unit's goodput (model
    time)."""

    deployment: Deployment
    unit: Deployment
    copies: int
    goodput: float
    estimate: float
    at: Summary | None
    bottleneck: str
    speed: float
    above: Summary | None = None
    """The unit's first point above its goodput, which missed."""

    @property
    def gpus(self) -> int:
        return self.deployment.gpus

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.gpus if self.gpus else 0.0

    def latency_ms(self, which: str) -> float | None:
        """A latency percentile at the goodput rate, wall ms: p90_ttft_ms, p90_tpot_ms, ..."""
        if self.at is None:
            return None
        value: float = getattr(self.at, which)
        return value / self.speed

    @property
    def tokens_per_user_s(self) -> float | None:
        """Per-user decode speed at the goodput rate (tokens/s: 1000 / P50 TPOT)."""
        tpot = self.latency_ms("p50_tpot_ms")
        return 1000 / tpot if tpot else None


@dataclass
class SizingResult:
    """The ranked deployments (best first; PD and colocated), the role capacities, and what
    the search cost."""

    problem: SizingProblem
    ranked: list[Rated]
    capacities: Capacities
    enumerated: int = 0
    refused: int = 0
    verified: int = 0
    points: int = 0
    seconds: float = 0.0
    reaches_target: bool = True

    @property
    def best(self) -> Rated | None:
        return self.ranked[0] if self.ranked else None

    @property
    def best_pd(self) -> Rated | None:
        return next((r for r in self.ranked if r.deployment.kind == "pd"), None)

    @property
    def best_colocated(self) -> Rated | None:
        return next((r for r in self.ranked if r.deployment.kind == "colocated"), None)


@dataclass(frozen=True)
class _Unit:
    unit: Deployment
    prefill_rate: float  # model requests/s of the unit's prefills, together
    decode_rate: float

    @property
    def estimate(self) -> float:
        return min(self.prefill_rate, self.decode_rate)

    def bottleneck(self) -> str:
        low, high = sorted((self.prefill_rate, self.decode_rate))
        if high - low <= BALANCED * high:
            return "balanced"
        return "prefill" if self.prefill_rate < self.decode_rate else "decode"


ROUGH = (1.5, 0.08, 1.3)
"""Lifetimes of arrivals per point, bisection tolerance and bracketing step of the capacities
that only rank candidates (their roofline estimates are rough); `FINE` for the goodputs the
result reports (started from measured capacities)."""
FINE = (2.0, 0.03, 1.1)


def meters(problem: SizingProblem) -> tuple[Meter, Meter]:
    """A rough and a fine meter for the problem's workload and SLO (see `ROUGH`)."""
    slo = problem.model_slo
    life = problem.workload.lifetime_s(slo)
    rough, fine = (
        Meter(SteadyWorkload(problem.workload, life, lifetimes), slo, tolerance, growth)
        for lifetimes, tolerance, growth in (ROUGH, FINE)
    )
    return rough, fine


def size(problem: SizingProblem, *, exhaustive: bool = False, verify: int = VERIFY) -> SizingResult:
    """Search the deployments of `problem` (see the module doc). With a target rate no
    deployment on the GPUs reaches, the result ranks by goodput and says so."""
    started = time.perf_counter()
    rough, meter = meters(problem)
    capacities = measure(problem, rough, meter)
    if not capacities.prefill:
        raise SizingError(
            f"{problem.model.name} fits on no TP size of {problem.gpu.name} these hosts hold "
            f"(up to {problem.gpus} GPUs): its weights leave no KV room. To fix: more GPUs per "
            "host, more hosts, or GPUs with more memory."
        )
    result = _search(
        problem, capacities, meter, problem.target_rate, exhaustive=exhaustive, verify=verify
    )
    if problem.target_rate is not None and not result.ranked:
        result = _search(problem, capacities, meter, None, exhaustive=exhaustive, verify=verify)
        result.reaches_target = False
    result.points = rough.points + meter.points
    result.seconds = time.perf_counter() - started
    return result


def _search(
    problem: SizingProblem,
    capacities: Capacities,
    meter: Meter,
    target: float | None,
    *,
    exhaustive: bool,
    verify: int,
) -> SizingResult:
    """Estimate, verify and rank for `target` (None: the most goodput on the GPUs)."""
    plans = [
        (unit, copies)
        for unit in _units(problem, capacities)
        if (copies := _copies(problem, target, unit.estimate, unit.unit))
    ]
    by_gpus = target is not None
    # Among equal estimates the smaller unit first: it is cheaper to serve and says the same.
    plans.sort(
        key=lambda p: (
            *_order(p[0].unit.gpus * p[1], p[0].estimate * p[1], by_gpus),
            p[0].unit.instances,
        )
    )
    chosen: dict[Deployment, _Unit] = {}
    refused: set[Deployment] = set()
    seen: set[tuple[int, float]] = set()
    for unit, copies in plans:
        if not exhaustive and len(chosen) >= verify:
            break
        # A deployment estimated like one already chosen (same GPUs, same estimate: the same
        # bottleneck group with another other side) is dominated.
        same = (unit.unit.gpus * copies, round(unit.estimate * copies, 6))
        if not exhaustive and same in seen:
            continue
        seen.add(same)
        if _placeable(problem, target, unit.unit, copies):
            chosen[unit.unit] = unit
        else:
            refused.add(unit.unit)
    ranked = [r for unit in chosen.values() if (r := _verified(problem, meter, target, unit))]
    if ranked:
        best = min(ranked, key=lambda r: _order(r.gpus, r.goodput, by_gpus))
        tuned = _tune_decode(problem, meter, target, best)
        ranked += [tuned] if tuned else []
    ranked += _colocated(problem, target, capacities)
    if target is not None:
        ranked = [r for r in ranked if r.goodput >= target * (1 - 1e-9)]
    ranked.sort(key=lambda r: _order(r.gpus, r.goodput, by_gpus))
    return SizingResult(
        problem=problem,
        ranked=ranked,
        capacities=capacities,
        enumerated=len(plans) + len(capacities.colocated),
        refused=len(refused),
        verified=len(chosen),
    )


def _order(gpus: int, goodput: float, by_gpus: bool) -> tuple[float, float]:
    """Sort key: most goodput then fewest GPUs, or (target rate) fewest GPUs then most."""
    return (gpus, -goodput) if by_gpus else (-goodput, gpus)


def _units(problem: SizingProblem, capacities: Capacities) -> Iterator[_Unit]:
    for p_option, p_rate in capacities.prefill.items():
        for d_option, d_rate in capacities.decode.items():
            if p_rate.single <= 0 or d_rate <= 0:
                continue
            for a in range(1, MAX_UNIT_INSTANCES):
                for b in range(1, MAX_UNIT_INSTANCES - a + 1):
                    gpus = a * p_option.gpus + b * d_option.gpus
                    if math.gcd(a, b) != 1 or gpus > problem.gpus:
                        continue
                    unit = Deployment(prefill=Group(p_option, a), decode=Group(d_option, b))
                    yield _Unit(unit, p_rate.at(a), b * d_rate)


def _copies(
    problem: SizingProblem, target: float | None, unit_rate: float, unit: Deployment
) -> int:
    """Copies of a unit serving `unit_rate` (model requests/s) each: as many as the GPUs
    hold, or as the `target` rate (wall requests/s) needs (0: more than the GPUs hold)."""
    most = problem.gpus // unit.gpus
    if target is None:
        return most
    if unit_rate <= 0:
        return 0
    need = math.ceil(target / problem.speed / unit_rate - 1e-9)
    return need if need <= most else 0


def _placeable(problem: SizingProblem, target: float | None, unit: Deployment, copies: int) -> int:
    """The most copies (up to `copies`) the validator accepts on the hosts; 0 for none. With
    a target rate the copies it needs, or 0."""
    if copies and target is not None:
        return copies if accepted(problem, unit.times(copies)) else 0
    while copies > 0 and not accepted(problem, unit.times(copies)):
        copies -= 1
    return copies


def _verified(
    problem: SizingProblem, meter: Meter, target: float | None, unit: _Unit
) -> Rated | None:
    measured = meter.goodput(unit.unit.cluster(problem), unit.estimate)
    copies = _copies(problem, target, measured.rate, unit.unit)
    copies = _placeable(problem, target, unit.unit, copies)
    if not copies or measured.rate <= 0:
        return None
    return Rated(
        deployment=unit.unit.times(copies),
        unit=unit.unit,
        copies=copies,
        goodput=copies * measured.rate * problem.speed,
        estimate=copies * unit.estimate * problem.speed,
        at=measured.at,
        bottleneck=unit.bottleneck(),
        speed=problem.speed,
        above=measured.above,
    )


def _tune_decode(
    problem: SizingProblem, meter: Meter, target: float | None, rated: Rated
) -> Rated | None:
    """The best PD deployment with its decodes' `--max-running-requests` capped at their
    steady batch within the TPOT, when its first rate above the goodput missed on TPOT (the
    decode batch grew too slow); kept only when it beats SGLang's default slots."""
    decode = rated.unit.decode
    if decode is None or rated.above is None:
        return None
    if rated.above.p90_tpot_ms <= problem.model_slo.tpot_ms:
        return None
    option = decode.option
    config = instance_config(problem, option, "decode")
    batch, _ = decode_batch(problem, config)
    cap = max(1, math.floor(batch)) * (option.dp if option.dp_attention else 1)
    if cap >= config.memory().max_running_requests:
        return None
    unit = Deployment(
        prefill=rated.unit.prefill, decode=Group(with_knobs(option, max_running=cap), decode.count)
    )
    model_rate = rated.goodput / rated.copies / problem.speed
    tuned = _verified(problem, meter, target, _Unit(unit, model_rate, model_rate))
    if tuned is None or not better(tuned.goodput, rated.goodput, meter):
        return None
    return replace(tuned, estimate=rated.estimate, bottleneck=rated.bottleneck)


def _colocated(problem: SizingProblem, target: float | None, capacities: Capacities) -> list[Rated]:
    out = []
    for option, measured in capacities.colocated.items():
        unit = Deployment(colocated=Group(option, 1))
        copies = _copies(problem, target, measured.rate, unit)
        if not copies or measured.rate <= 0:
            continue
        above = measured.above
        tpot = above is not None and above.p90_tpot_ms > problem.model_slo.tpot_ms
        out.append(
            Rated(
                deployment=unit.times(copies),
                unit=unit,
                copies=copies,
                goodput=copies * measured.rate * problem.speed,
                estimate=copies * measured.rate * problem.speed,
                at=measured.at,
                bottleneck="TPOT" if tpot else "TTFT",
                speed=problem.speed,
                above=above,
            )
        )
    return out
