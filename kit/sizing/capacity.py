"""Stage one of the search: what one instance of each role option sustains on its own.

* prefill: a prefill-only instance (DistServe's set-up: the KV leaves at once) served in
  virtual time, under the TTFT objective less the KV transfer of a mean prompt and one decode
  step, which a PD request still pays before its first token; and `GROUP_PROBE` of them behind
  round-robin, which sustain more than as many times one (`GroupRate`);
* decode: the steady state of a decode instance, worked out rather than served (serving it
  costs a simulated step per token, and a decode at hundreds of requests/s needs thousands of
  requests to reach its steady batch): at rate r its batch B holds r x (output - 1) x step(B)
  requests, and the largest B whose P90 batch (B + 1.28 sqrt B, Poisson) still steps within the
  TPOT, fits its KV room and its request slots, gives its rate. On the DistServe workload this
  is within 5% of a long virtual-time run;
* colocated: one instance served in virtual time under both objectives; its goodput is final
  (k instances behind a round-robin router serve k times one).

Prefill and decode capacities only rank candidates (the search serves the PD deployments it
keeps); colocated goodputs are reported as they are, so the colocated option with the best
goodput per GPU is also tried with smaller prefill chunks when it misses on TPOT (prefill
stalls); a chunk is kept only when it beats SGLang's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.timing import StepShape
from kit.sizing.candidates import RoleOption, base_options, instance_config, with_knobs
from kit.sizing.measure import Goodput, Meter
from kit.sizing.problem import SizingProblem
from kit.topology.schema import SLO

COLOCATED_CHUNKS = (2048, 512)
"""Prefill chunks (tokens) tried on the best colocated option when it misses on TPOT."""
COLOCATED_SHARE = 0.6
"""A colocated instance's goodput starts its search at this share of what it prefills alone
(prefill stalls of its decodes cost it the rest)."""
P90_Z = 1.28
"""Standard normal quantile of 90%: a Poisson batch of mean B exceeds B + 1.28 sqrt B one
step in ten."""


GROUP_PROBE = 2
"""Prefill instances served together to see what round-robin dealing gains (two predict
three to six within about 10% on the DistServe workload, at half the cost of probing four)."""


@dataclass(frozen=True)
class GroupRate:
    """What `count` prefill instances behind a round-robin router sustain together (model
    requests/s). Each sees every count-th request, arrivals far more even than a Poisson
    stream, so it queues less than one instance alone at the same rate: per instance
    ``limit - (limit - single) / count``, fitted on one instance and on `GROUP_PROBE`."""

    single: float
    limit: float

    def at(self, count: int) -> float:
        return count * self.limit - (self.limit - self.single)


@dataclass
class Capacities:
    """Each role option: prefill group rates and decode rates (model requests/s), colocated
    goodputs."""

    prefill: dict[RoleOption, GroupRate] = field(default_factory=dict)
    decode: dict[RoleOption, float] = field(default_factory=dict)
    colocated: dict[RoleOption, Goodput] = field(default_factory=dict)


def mean_lengths(problem: SizingProblem) -> tuple[float, float]:
    """Mean prompt and output lengths (tokens) of the workload."""
    spec = problem.workload
    if spec.trace:
        entries = spec.trace[: spec.count]
        return (
            sum(e.input_len for e in entries) / len(entries),
            sum(e.output_len for e in entries) / len(entries),
        )
    return spec.input.mean, spec.output.mean


def prefill_slo(problem: SizingProblem, config: InstanceConfig) -> SLO:
    """The TTFT a prefill-only instance may take: the SLO's, less what a PD request pays
    after its prefill (KV transfer of a mean prompt, the decode's first step)."""
    slo = problem.model_slo
    prompt, _ = mean_lengths(problem)
    timing = config.build_timing()
    after = timing.kv_transfer_seconds(round(prompt), rdma=problem.rdma) + timing.step_seconds(
        StepShape(decode_reqs=1, decode_context=round(prompt), sampled=1)
    )
    ttft = max(slo.ttft_ms - after * 1000, slo.ttft_ms * 0.1)
    return SLO(ttft_ms=ttft, tpot_ms=slo.tpot_ms, attainment=slo.attainment)


def prefill_estimate(problem: SizingProblem, config: InstanceConfig) -> float:
    """Requests/s one instance prefills back to back (roofline)."""
    prompt, _ = mean_lengths(problem)
    step = config.build_timing().step_seconds(StepShape(prefill=((round(prompt), 0),), sampled=1))
    return config.dp / step


def decode_batch(problem: SizingProblem, config: InstanceConfig) -> tuple[float, float]:
    """One rank's steady batch (requests, see the module doc) and its step (s); (0, inf)
    when not even one request decodes within the TPOT."""
    prompt, output = mean_lengths(problem)
    timing = config.build_timing()
    memory = config.memory(timing)
    slots = memory.max_running_requests // (config.dp if config.dp_attention else 1)
    tpot = problem.model_slo.tpot_ms / 1000

    def step(batch: float) -> float:
        whole = max(1, round(batch))
        context = round(whole * (prompt + output / 2))
        return timing.step_seconds(
            StepShape(decode_reqs=whole, decode_context=context, sampled=whole)
        )

    def holds(batch: float) -> bool:
        peak = batch + P90_Z * math.sqrt(batch)
        return (
            step(peak) <= tpot
            and peak <= slots
            and peak * (prompt + output) <= memory.capacity_tokens
        )

    if not holds(1.0):
        return 0.0, math.inf
    low, high = 1.0, 2.0
    while holds(high):
        low, high = high, high * 2
    while high - low > 0.5:
        mid = (low + high) / 2
        low, high = (mid, high) if holds(mid) else (low, mid)
    return low, step(low)


def decode_rate(problem: SizingProblem, config: InstanceConfig) -> float:
    """Requests/s one decode instance sustains within the TPOT (see the module doc)."""
    _, output = mean_lengths(problem)
    batch, step = decode_batch(problem, config)
    if batch <= 0:
        return 0.0
    return config.dp * batch / (max(output - 1, 1.0) * step)


def prefill_group(problem: SizingProblem, config: InstanceConfig, meter: Meter) -> GroupRate:
    """What prefill instances of `config` sustain alone and behind round-robin (see the
    module doc), measured by `meter`."""
    slo = prefill_slo(problem, config)
    single = meter.goodput(
        Cluster(prefill=Instances(config)), prefill_estimate(problem, config), slo=slo
    ).rate
    group = meter.goodput(
        Cluster(prefill=Instances(config, GROUP_PROBE)), single * GROUP_PROBE, slo=slo
    ).rate
    # at(GROUP_PROBE) == group; a group never does worse than its instances alone.
    return GroupRate(single, max((group - single) / (GROUP_PROBE - 1), single))


def measure(problem: SizingProblem, rough: Meter, fine: Meter) -> Capacities:
    """Stage one for every role option (see the module doc): prefill capacities by `rough`,
    colocated goodputs by `fine`."""
    found = Capacities()
    for option in base_options(problem, "prefill"):
        found.prefill[option] = prefill_group(
            problem, instance_config(problem, option, "prefill"), rough
        )
    for option in base_options(problem, "decode"):
        found.decode[option] = decode_rate(problem, instance_config(problem, option, "decode"))
    for option in base_options(problem, "colocated"):
        config = instance_config(problem, option, "colocated")
        alone = found.prefill.get(option)
        start = alone.single if alone else prefill_estimate(problem, config)
        found.colocated[option] = fine.goodput(
            Cluster(colocated=Instances(config)), start * COLOCATED_SHARE
        )
    _tune_colocated(problem, fine, found)
    return found


def misses_tpot(goodput: Goodput, slo: SLO) -> bool:
    """The first rate above the goodput missed because TPOT grew (not only TTFT)."""
    above = goodput.above
    return above is not None and above.p90_tpot_ms > slo.tpot_ms


def better(tuned: float, default: float, meter: Meter) -> bool:
    """A tuned knob is kept only when it beats SGLang's default by more than the search's
    precision; otherwise the default says the same with less to configure."""
    return tuned > default * (1 + meter.tolerance)


def _tune_colocated(problem: SizingProblem, meter: Meter, found: Capacities) -> None:
    if not found.colocated:
        return
    option, measured = max(found.colocated.items(), key=lambda item: item[1].rate / item[0].gpus)
    if not misses_tpot(measured, problem.model_slo):
        return
    config = instance_config(problem, option, "colocated")
    default_chunk = config.memory().chunked_prefill_size
    for chunk in COLOCATED_CHUNKS:
        if chunk >= default_chunk or chunk % config.page_size:
            continue
        tuned = with_knobs(option, chunk=chunk)
        goodput = meter.goodput(
            Cluster(colocated=Instances(instance_config(problem, tuned, "colocated"))),
            measured.rate or 1.0,
        )
        if better(goodput.rate, measured.rate, meter):
            found.colocated[tuned] = goodput
