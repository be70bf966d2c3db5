"""What kit/perf predicts for each split of the pool, corrected by what the deployment showed.

Goodput of a split: kit/sizing's capacity estimate, the one its search ranks candidates by.
A prefill group's rate comes from serving one and `GROUP_PROBE` prefill-only instances in
virtual time under the TTFT objective less what a PD request pays after its prefill
(`kit.sizing.capacity.prefill_slo`), a decode's from its steady batch within the TPOT
(`decode_rate`); P prefills and D decodes sustain min(prefill group at P, D x decode) requests/s.
The mix is the forecast's: fixed prompt and output lengths at their means.

Corrections: the efficiency factors of `kit.perf.timing.Efficiency`, fitted as `pdkit size
--calibrate` fits them (`kit.sizing.calibration`: golden-section search on each factor in
turn, minimising the squared log error of the latencies it governs, compute for TTFT, memory
for TPOT), to the interval's observed P50/P90 TTFT and TPOT. The requests replayed are the
interval's as far as the metrics tell them: Poisson arrivals at the observed rate with the
observed mean lengths, on the current split. The first fit replaces kit/perf's factors;
later ones move them part of the way, by the interval's size (`FIT_PRIOR_REQUESTS`), since one
short interval's fit is noisy. The fit is skipped when the model is within
`FIT_TOLERANCE` already; a factor is left alone when, at kit/perf's sourced factors, the model
explains less than `MIN_EXPLAINED` of its latencies (the rest is overhead it does not model:
128-token prompts' TTFT is mostly HTTP and router time, and fitting it as slow GPUs would
make every long prefill look slow); and an interval where fewer than half the requests met
the SLO is not fitted (as calibration skips overloaded points: a queue says more about the load
than the GPUs).

Rates are wall requests/s; the model runs at full speed under the SLO scaled by the sim's
`PDKIT_SIM_SPEED` (`kit.bench.predict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kit.autoscale.decide import Mix, Split
from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.timing import Efficiency
from kit.perf.workload import Lengths, Request, WorkloadSpec, poisson_workload
from kit.sizing.calibration import (
    BOUNDS,
    FITS,
    Latencies,
    golden_section,
    log_error,
    mape,
    with_efficiency,
)
from kit.sizing.capacity import decode_rate, prefill_group
from kit.sizing.measure import Meter, SteadyWorkload
from kit.sizing.problem import SizingProblem
from kit.sizing.search import ROUGH
from kit.topology.schema import SLO, Topology

FIT_TOLERANCE = 0.1
"""Mean error of the four latencies (0.1: 10%) below which the factors are left as they are."""
MIN_EXPLAINED = 0.25
"""Least share of an observed latency the model must explain at its sourced factors for the
factor behind it to be fitted (see `PoolModel.correct`)."""
REPLAY_REQUESTS = 120
"""Most requests replayed per fit evaluation (the interval's count when fewer)."""
FIT_PRIOR_REQUESTS = 60
"""After the first fit, an interval of n requests moves the factors n / (n + 60) of the way
(geometrically) to what it fitted: one short interval's fit wobbles by a third (measured: the
compute factor 0.21-0.41 over 10 minutes of one steady workload, 15-30 requests per 6 s
interval), enough to swing a split's predicted goodput past the hysteresis; the first fit
replaces kit/perf's sourced factors outright."""
MIX_ROUNDING = 0.05
"""Mixes within 5% of one measured before reuse its capacities."""


@dataclass(frozen=True)
class Observed:
    """One interval's latencies as the router measured them (wall ms), the share of requests
    that met the SLO (None when the router does not say) and the requests finished."""

    latencies: Latencies
    attainment: float | None
    requests: int


@dataclass(frozen=True)
class Corrected:
    """The outcome of one fit: the factors, and the model's error before and after it."""

    efficiency: Efficiency
    error_before: float
    error_after: float
    fitted: bool


@dataclass
class PoolModel:
    """kit/perf for one pool: the prefill and decode launch as the Plan has them (the same
    size), the SLO and the sim speed."""

    prefill: InstanceConfig
    decode: InstanceConfig
    slo: SLO
    topology: Topology
    speed: float = 1.0
    efficiency: Efficiency = field(default_factory=Efficiency)
    fits: int = 0
    """Fits kept so far (the first replaces the sourced factors, later ones blend in)."""
    _capacities: dict[tuple[int, int, float, float], tuple[float, float, float]] = field(
        default_factory=dict
    )

    @property
    def rdma(self) -> bool:
        return self.topology.transfer.backend != "mooncake_tcp"

    def _problem(self, mix: Mix) -> SizingProblem:
        workload = WorkloadSpec(
            input=Lengths.fixed(max(1, round(mix.input_tokens))),
            output=Lengths.fixed(max(2, round(mix.output_tokens))),
        )
        return SizingProblem(
            model=self.prefill.model,
            gpu=self.prefill.gpu,
            base=self.topology.model_dump(mode="json", exclude_none=True),
            slo=self.slo,
            workload=workload,
            efficiency=self.efficiency,
            speed=self.speed,
        )

    def _config(self, config: InstanceConfig) -> InstanceConfig:
        return replace(config, efficiency=self.efficiency)

    def capacities(self, mix: Mix) -> tuple[float, float, float]:
        """(one prefill, the per-instance limit of a prefill group, one decode), model
        requests/s at the mix's lengths (see the module doc)."""
        key = (
            _bucket(mix.input_tokens),
            _bucket(mix.output_tokens),
            round(self.efficiency.compute, 3),
            round(self.efficiency.memory, 3),
        )
        found = self._capacities.get(key)
        if found is not None:
            return found
        problem = self._problem(mix)
        lifetimes, tolerance, growth = ROUGH
        spec = problem.workload
        meter = Meter(
            SteadyWorkload(spec, spec.lifetime_s(problem.model_slo), lifetimes),
            problem.model_slo,
            tolerance,
            growth,
        )
        group = prefill_group(problem, self._config(self.prefill), meter)
        decode = decode_rate(problem, self._config(self.decode))
        found = (group.single, group.limit, decode)
        self._capacities[key] = found
        return found

    def goodput(self, split: Split, mix: Mix) -> float:
        """Predicted goodput (wall requests/s) of `split` at the mix's lengths."""
        single, limit, decode = self.capacities(mix)
        prefills = split.prefill * limit - (limit - single)
        return max(0.0, min(prefills, split.decode * decode)) * self.speed

    def goodputs(self, splits: list[Split], mix: Mix) -> dict[Split, float]:
        return {split: self.goodput(split, mix) for split in splits}

    def bottleneck(self, split: Split, mix: Mix) -> str:
        single, limit, decode = self.capacities(mix)
        prefills = split.prefill * limit - (limit - single)
        return "prefill" if prefills < split.decode * decode else "decode"

    # -- corrections ---------------------------------------------------------------------

    def cluster(self, split: Split, efficiency: Efficiency) -> Cluster:
        cluster = Cluster(
            prefill=Instances(self.prefill, split.prefill),
            decode=Instances(self.decode, split.decode),
            rdma=self.rdma,
        )
        return with_efficiency(cluster, efficiency)

    def replay(self, split: Split, mix: Mix, count: int, efficiency: Efficiency) -> Latencies:
        """The model's P50/P90 TTFT and TPOT (wall ms) for `count` Poisson requests of the
        mix on `split`."""
        requests = poisson_workload(
            mix.rate / self.speed,
            max(count, 10),
            max(1, round(mix.input_tokens)),
            max(2, round(mix.output_tokens)),
        )
        outcomes = self.cluster(split, efficiency).run(requests)
        scale = 1000 / self.speed
        answered = [(o.ttft_s, o.tpot_s) for o in outcomes if math.isfinite(o.ttft_s)]
        return Latencies.of([t * scale for t, _ in answered], [p * scale for _, p in answered])

    def correct(self, split: Split, mix: Mix, observed: Observed) -> Corrected:
        """Fit the efficiency factors to the interval (see the module doc) and keep them."""
        count = min(observed.requests, REPLAY_REQUESTS)
        start = self.efficiency
        before = self.replay(split, mix, count, start)
        error_before = mape(before, observed.latencies)
        overloaded = observed.attainment is not None and observed.attainment < 0.5
        if error_before <= FIT_TOLERANCE or overloaded:
            return Corrected(start, error_before, error_before, False)
        cache: dict[tuple[float, float], Latencies] = {}

        def predicted(efficiency: Efficiency) -> Latencies:
            key = (round(efficiency.compute, 4), round(efficiency.memory, 4))
            if key not in cache:
                cache[key] = self.replay(split, mix, count, efficiency)
            return cache[key]

        # The latency the GPUs explain at kit/perf's own factors: where that is a small share
        # of what was seen, the rest is what the roofline does not model (HTTP hops, the
        # router, Mooncake handshakes), and fitting it into an efficiency would misjudge
        # longer requests (short prompts' TTFT would make every long prefill look slow).
        sourced = predicted(Efficiency.for_gpu(self.prefill.gpu))
        current = start
        for factor, metrics in FITS.items():
            explained = [
                getattr(sourced, m) / getattr(observed.latencies, m)
                for m in metrics
                if getattr(observed.latencies, m) > 0
            ]
            if not explained or min(explained) < MIN_EXPLAINED:
                continue
            fixed = current

            def loss(
                value: float,
                fixed: Efficiency = fixed,
                factor: str = factor,
                metrics: tuple[str, ...] = metrics,
            ) -> float:
                return log_error(
                    predicted(replace(fixed, **{factor: value})), observed.latencies, metrics
                )

            current = replace(current, **{factor: golden_section(loss, *BOUNDS, 0.05)})
        if self.fits:
            weight = observed.requests / (observed.requests + FIT_PRIOR_REQUESTS)
            current = Efficiency(
                compute=start.compute ** (1 - weight) * current.compute**weight,
                memory=start.memory ** (1 - weight) * current.memory**weight,
            )
        error_after = mape(predicted(current), observed.latencies)
        if error_after >= error_before:
            return Corrected(start, error_before, error_before, False)
        self.efficiency = current
        self.fits += 1
        return Corrected(current, error_before, error_after, True)


def _bucket(tokens: float) -> int:
    """`tokens` rounded to the nearest step of a geometric grid (`MIX_ROUNDING`)."""
    if tokens <= 1:
        return 1
    step = math.log1p(MIX_ROUNDING)
    return round(math.exp(round(math.log(tokens) / step) * step))


def replayed_requests(mix: Mix, count: int, speed: float) -> list[Request]:
    """The requests a fit replays (exposed for the bench's timeline)."""
    return poisson_workload(
        mix.rate / speed, max(count, 10), round(mix.input_tokens), round(mix.output_tokens)
    )
