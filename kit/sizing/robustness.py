"""How the chosen deployment holds when the traffic is not what was planned: its goodput with
every prompt (or every output) twice as long, or half as long, the rest of the workload kept
(arrivals, seed, the other length). A ratio sized for 512/64 tokens that halves its goodput at
1024/64 is a fragile answer; the table says so before the hardware is bought.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kit.perf.workload import Lengths, WorkloadSpec
from kit.sizing.measure import Meter, SteadyWorkload
from kit.sizing.problem import SizingProblem
from kit.sizing.search import FINE, Rated

VARIANTS = (("input", 2.0), ("input", 0.5), ("output", 2.0), ("output", 0.5))
"""(which length, factor) of each row."""


@dataclass(frozen=True)
class Variant:
    """The deployment's goodput (wall requests/s) with one length scaled."""

    length: str
    factor: float
    goodput: float
    planned: float

    @property
    def change(self) -> float:
        """Relative change against the planned workload's goodput (-0.25: 25% less)."""
        return self.goodput / self.planned - 1 if self.planned else 0.0

    def describe(self) -> str:
        return f"{self.length} x{self.factor:g}"


def scaled_lengths(lengths: Lengths, factor: float) -> Lengths:
    """The same distribution with every length times `factor` (at least 1 token)."""
    if lengths.kind == "histogram":
        return replace(lengths, values=tuple(max(1, round(v * factor)) for v in lengths.values))
    if lengths.kind == "lognormal":  # sigma is shape, not scale
        return replace(lengths, a=max(1.0, lengths.a * factor))
    return replace(lengths, a=max(1.0, round(lengths.a * factor)), b=lengths.b * factor)


def scaled_workload(spec: WorkloadSpec, length: str, factor: float) -> WorkloadSpec:
    """`spec` with its prompts (`length` "input") or outputs ("output") scaled."""
    if spec.trace:
        entries = tuple(
            replace(e, input_len=max(1, round(e.input_len * factor)))
            if length == "input"
            else replace(e, output_len=max(1, round(e.output_len * factor)))
            for e in spec.trace
        )
        return replace(spec, trace=entries)
    if length == "input":
        return replace(spec, input=scaled_lengths(spec.input, factor))
    return replace(spec, output=scaled_lengths(spec.output, factor))


def robustness(problem: SizingProblem, rated: Rated) -> list[Variant]:
    """The rated deployment under each of `VARIANTS` (its unit served, times its copies)."""
    out = []
    model_slo = problem.model_slo
    lifetimes, tolerance, _ = FINE
    cluster = rated.unit.cluster(problem)
    unit_rate = rated.goodput / rated.copies / problem.speed
    for length, factor in VARIANTS:
        spec = scaled_workload(problem.workload, length, factor)
        meter = Meter(
            SteadyWorkload(spec, spec.lifetime_s(model_slo), lifetimes),
            model_slo,
            tolerance,
            growth=1.5,  # started from a guess, not a measurement
        )
        # Prefill work grows with the prompt: start from the planned rate over the factor.
        start = unit_rate / factor if length == "input" else unit_rate
        found = meter.goodput(cluster, start)
        out.append(
            Variant(length, factor, found.rate * rated.copies * problem.speed, rated.goodput)
        )
    return out
