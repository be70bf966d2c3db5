"""Stage one of the search: what one instance of each role option sustains on its own.

* prefill: a prefill-only instance (DistServe's set-up: the KV leaves at once), under the TTFT
  objective less the KV transfer of a mean prompt and one decode step, which a PD request
  still pays before its first token;
* decode: a decode-only instance (the KV appears at once) under both objectives;
* colocated: one instance under both objectives (its goodput is final: k colocated instances
  behind a round-robin router serve k times one).

Each is a goodput search in virtual time (`kit.sizing.measure`) started from a roofline
estimate. Knobs are then tuned where the measurement says they can help, and only there:
a decode whose point above its goodput missed on TPOT (its batch grew too slow) is tried with
`--max-running-requests` capped at the largest batch whose step meets the TPOT; a colocated
option with the best goodput per GPU, missing on TPOT (prefill stalls), is tried with smaller
prefill chunks (the others are dominated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.timing import StepShape
from kit.sizing.candidates import RoleOption, base_options, instance_config, with_knobs
from kit.sizing.measure import Goodput, Meter
from kit.sizing.problem import SizingProblem
from kit.topology.schema import SLO

COLOCATED_CHUNKS = (2048, 512)
"""Prefill chunks (tokens) tried on the best colocated option when it misses on TPOT."""
COLOCATED_SHARE = 0.5
"""A colocated instance's goodput starts its search at this share of the smaller of its
prefill and decode rooflines (prefill stalls cost it the rest)."""


@dataclass
class Capacities:
    """Single-instance goodput (model requests/s) of every role option measured."""

    prefill: dict[RoleOption, Goodput] = field(default_factory=dict)
    decode: dict[RoleOption, Goodput] = field(default_factory=dict)
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


def decode_batch(problem: SizingProblem, config: InstanceConfig) -> tuple[int, float]:
    """The largest batch (a power of two) one rank can decode within the TPOT objective and
    its KV room, and that batch's step (s)."""
    prompt, output = mean_lengths(problem)
    timing = config.build_timing()
    memory = config.memory(timing)
    per_request = prompt + output
    tpot = problem.model_slo.tpot_ms / 1000

    def step(batch: int) -> float:
        context = round(batch * (prompt + output / 2))
        return timing.step_seconds(
            StepShape(decode_reqs=batch, decode_context=context, sampled=batch)
        )

    batch = 1
    while (
        batch * 2 <= memory.max_running_requests
        and batch * 2 * per_request <= memory.capacity_tokens
        and step(batch * 2) <= tpot
    ):
        batch *= 2
    return batch, step(batch)


def decode_estimate(problem: SizingProblem, config: InstanceConfig) -> float:
    """Requests/s one instance decodes at its largest batch within the TPOT (roofline)."""
    _, output = mean_lengths(problem)
    batch, step = decode_batch(problem, config)
    return config.dp * batch / (max(output, 1.0) * step)


def measure(problem: SizingProblem, rough: Meter, fine: Meter) -> Capacities:
    """Stage one for every role option (see the module doc). Prefill and decode capacities
    only rank candidates, so `rough` measures them; colocated goodputs are final, measured by
    `fine`."""
    found = Capacities()
    for option in base_options(problem):
        config = instance_config(problem, option)
        p_rate, d_rate = prefill_estimate(problem, config), decode_estimate(problem, config)
        found.prefill[option] = rough.goodput(
            Cluster(prefill=Instances(config)), p_rate, slo=prefill_slo(problem, config)
        )
        found.decode[option] = rough.goodput(Cluster(decode=Instances(config)), d_rate)
        found.colocated[option] = fine.goodput(
            Cluster(colocated=Instances(config)), min(p_rate, d_rate) * COLOCATED_SHARE
        )
    _tune_decode(problem, rough, found)
    _tune_colocated(problem, fine, found)
    return found


def _misses_tpot(goodput: Goodput, slo: SLO) -> bool:
    above = goodput.above
    return above is not None and above.p90_tpot_ms > slo.tpot_ms


def _tune_decode(problem: SizingProblem, meter: Meter, found: Capacities) -> None:
    for option, measured in list(found.decode.items()):
        if not _misses_tpot(measured, problem.model_slo):
            continue
        config = instance_config(problem, option)
        batch, _ = decode_batch(problem, config)
        cap = batch * (option.dp if option.dp_attention else 1)
        if cap >= config.memory().max_running_requests:
            continue
        capped = with_knobs(option, max_running=cap)
        tuned = meter.goodput(
            Cluster(decode=Instances(instance_config(problem, capped))), measured.rate or 1.0
        )
        if _better(tuned, measured, meter):
            found.decode[capped] = tuned


def _tune_colocated(problem: SizingProblem, meter: Meter, found: Capacities) -> None:
    if not found.colocated:
        return
    option, measured = max(found.colocated.items(), key=lambda item: item[1].rate / item[0].gpus)
    if not _misses_tpot(measured, problem.model_slo):
        return
    default_chunk = instance_config(problem, option).memory().chunked_prefill_size
    for chunk in COLOCATED_CHUNKS:
        if chunk >= default_chunk or chunk % problem.knobs.page_size:
            continue
        tuned = with_knobs(option, chunk=chunk)
        goodput = meter.goodput(
            Cluster(colocated=Instances(instance_config(problem, tuned))), measured.rate or 1.0
        )
        if _better(goodput, measured, meter):
            found.colocated[tuned] = goodput


def _better(tuned: Goodput, default: Goodput, meter: Meter) -> bool:
    """A tuned knob is kept only when it beats SGLang's default by more than the search's
    precision; otherwise the default says the same with less to configure."""
    return tuned.rate > default.rate * (1 + meter.tolerance)
