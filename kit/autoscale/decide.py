"""The decision engine: one interval's inputs in, one decision with its reason out. Pure: no
I/O, no clock (the time is an input), no randomness; the state it carries from one interval
to the next is a value it returns.

Checks, in order (the first that applies decides):

1. the forecast made for this interval is compared with what was observed: an error above
   `prediction_error` plus the sampling noise of the interval's n finished requests
   (2/sqrt(n), `Limits.tolerance`) counts one more mispredicted interval, a good one resets
   the count;
2. a change is in flight (the last one has not finished, or an instance is not serving):
   hold;
3. no workload could be measured, and the prefills finished no request in an interval longer
   than the TTFT objective while at least `min_requests` requests wait on them
   (`Inputs.stalled`): they are saturated, and nothing says yet how long the new prompts are;
   move one instance to prefill (outside the cooldown and the bounds; hold otherwise). Then:
   too few requests in the interval to judge the workload: hold;
4. `mispredicted_intervals` in a row mispredicted: stop acting, and say so, until a forecast
   holds again;
5. the last change is younger than `cooldown_s`: hold;
6. every split within the bounds and `max_step` of the current one that leaves each role at
   least one serving instance is ranked by the predicted goodput the caller gives for it; the
   best moves only when it beats the current split's by more than `hysteresis` (so a steady
   workload, whose predictions wobble by a few percent, never flaps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from kit.topology.autoscale_checks import role_bounds
from kit.topology.schema import Topology

Action = Literal["hold", "move", "paused"]


@dataclass(frozen=True, order=True)
class Split:
    """Instances per role out of the pool."""

    prefill: int
    decode: int

    @property
    def pool(self) -> int:
        return self.prefill + self.decode

    def describe(self) -> str:
        return f"{self.prefill}P{self.decode}D"


@dataclass(frozen=True)
class Limits:
    """The topology's `autoscale:` section, bounds resolved (see `Autoscale`)."""

    prefill_min: int
    prefill_max: int
    decode_min: int
    decode_max: int
    hysteresis: float = 0.15
    cooldown_s: float = 120.0
    max_step: int = 1
    prediction_error: float = 0.5
    mispredicted_intervals: int = 3
    min_requests: int = 20

    def tolerance(self, requests: int) -> float:
        """The forecast error an interval of `requests` finished requests may show before it
        counts as mispredicted (or, for the forecast, as a step change): `prediction_error`
        plus two standard errors of sampling, 2/sqrt(n). A Poisson count of n requests, or a
        mean of n lengths, wobbles by about 1/sqrt(n) with no change in the workload: 18
        requests in a short interval are 24% off their own rate half the time."""
        return self.prediction_error + (2 / math.sqrt(requests) if requests > 0 else 0.0)

    @classmethod
    def of(cls, topology: Topology) -> Limits:
        scale = topology.autoscale
        if scale is None:
            raise ValueError("the topology has no autoscale: section")
        p_low, p_high = role_bounds(topology, "prefill")
        d_low, d_high = role_bounds(topology, "decode")
        return cls(
            p_low,
            p_high,
            d_low,
            d_high,
            hysteresis=scale.hysteresis,
            cooldown_s=scale.cooldown_s,
            max_step=scale.max_step,
            prediction_error=scale.prediction_error,
            mispredicted_intervals=scale.mispredicted_intervals,
            min_requests=scale.min_requests,
        )


@dataclass(frozen=True)
class Mix:
    """A workload over one interval: arrival rate (requests/s) and mean prompt and output
    lengths (tokens)."""

    rate: float
    input_tokens: float
    output_tokens: float

    def error(self, observed: Mix) -> float:
        """The largest relative error of this forecast against `observed` (0.2: 20%), each
        relative to the smaller of the two (symmetric: 300 tokens forecast for 150 and 150 for
        300 are both 100% off)."""
        pairs = (
            (self.rate, observed.rate),
            (self.input_tokens, observed.input_tokens),
            (self.output_tokens, observed.output_tokens),
        )
        return max(
            abs(f - o) / min(f, o) if min(f, o) > 0 else (0.0 if f == o else 1.0) for f, o in pairs
        )

    def describe(self) -> str:
        return (
            f"{self.rate:.2f} req/s, {self.input_tokens:.0f} in / {self.output_tokens:.0f} out "
            "tokens"
        )


@dataclass(frozen=True)
class Inputs:
    """What one decision is made from.

    `observed`: the interval's workload (None when it could not be measured); `requests`:
    the requests it was measured on (arrived where the router counts them, else finished);
    `forecast`: the next interval's workload; `current`: the split the deployment runs;
    `serving`: the instances per role that serve now (healthy, in the router); `in_flight`:
    what change is still running, if any; `goodput`: the predicted goodput (requests/s)
    under the SLO at the forecast's lengths of each split the caller evaluated
    (`candidates`), the current one included; `stalled`: requests waiting on the prefills
    when they finished none in an interval longer than the TTFT objective (0: no stall)."""

    now_s: float
    observed: Mix | None
    requests: int
    forecast: Mix | None
    current: Split
    serving: Split
    goodput: Mapping[Split, float] = field(default_factory=dict)
    in_flight: str | None = None
    stalled: int = 0


@dataclass(frozen=True)
class Memory:
    """What the engine carries from one interval to the next."""

    last_change_s: float | None = None
    mispredicted: int = 0
    last_forecast: Mix | None = None


@dataclass(frozen=True)
class Decision:
    """One interval's verdict: hold the split, move to `target`, or paused (acting stopped
    because forecasts failed). `error`: this interval's forecast error (None: no forecast to
    check)."""

    action: Action
    current: Split
    target: Split
    reason: str
    current_goodput: float | None = None
    target_goodput: float | None = None
    error: float | None = None

    @property
    def moves(self) -> int:
        """Instances that change role (prefill to decode when negative)."""
        return self.target.prefill - self.current.prefill


def candidates(limits: Limits, current: Split, serving: Split | None = None) -> list[Split]:
    """Every split the engine may choose from `current`: within the bounds, at most
    `max_step` instances moved, and never leaving a role without a serving instance (an
    instance leaving a role is drained first). The current split is always first."""
    serving = serving or current
    out = [current]
    for prefill in range(limits.prefill_min, limits.prefill_max + 1):
        decode = current.pool - prefill
        moved = prefill - current.prefill
        if moved == 0 or abs(moved) > limits.max_step:
            continue
        if not limits.decode_min <= decode <= limits.decode_max:
            continue
        # The role that gives instances away keeps at least one serving.
        giver = serving.decode if moved > 0 else serving.prefill
        if giver - abs(moved) < 1:
            continue
        out.append(Split(prefill, decode))
    return out


def _hold(inputs: Inputs, reason: str, error: float | None) -> Decision:
    return Decision(
        "hold",
        inputs.current,
        inputs.current,
        reason,
        current_goodput=inputs.goodput.get(inputs.current),
        error=error,
    )


def _cooling(limits: Limits, memory: Memory, inputs: Inputs) -> str | None:
    if memory.last_change_s is None:
        return None
    since = inputs.now_s - memory.last_change_s
    if since >= limits.cooldown_s:
        return None
    return f"cooldown: the last change was {since:.0f} s ago (cooldown_s {limits.cooldown_s:g})"


def _stalled(limits: Limits, memory: Memory, inputs: Inputs, error: float | None) -> Decision:
    """The prefills finished nothing while requests waited on them longer than the TTFT
    objective: they are saturated, whatever the model would say of a mix no finished request
    describes yet. One instance moves to prefill (then the next interval's requests say how
    far to go)."""
    current = inputs.current
    stall = (
        f"the prefills finished no request in the interval while {inputs.stalled} waited on "
        "them past the TTFT objective"
    )
    cooling = _cooling(limits, memory, inputs)
    if cooling is not None:
        return _hold(inputs, f"{stall}; {cooling}", error)
    target = Split(current.prefill + 1, current.decode - 1)
    if target not in candidates(limits, current, inputs.serving):
        return _hold(inputs, f"{stall}, but the bounds allow no more prefills", error)
    return Decision(
        "move",
        current,
        target,
        f"{stall}: they are saturated; move 1 instance from decode to prefill",
        current_goodput=inputs.goodput.get(current),
        target_goodput=inputs.goodput.get(target),
        error=error,
    )


def decide(limits: Limits, memory: Memory, inputs: Inputs) -> tuple[Decision, Memory]:
    """The decision for this interval and the memory for the next (see the module doc)."""
    error: float | None = None
    mispredicted = memory.mispredicted
    if memory.last_forecast is not None and inputs.observed is not None:
        error = memory.last_forecast.error(inputs.observed)
        mispredicted = mispredicted + 1 if error > limits.tolerance(inputs.requests) else 0
    memory = replace(memory, mispredicted=mispredicted, last_forecast=inputs.forecast)
    decision = _verdict(limits, memory, inputs, error)
    if decision.action == "move":
        memory = replace(memory, last_change_s=inputs.now_s)
    return decision, memory


def _verdict(limits: Limits, memory: Memory, inputs: Inputs, error: float | None) -> Decision:
    current = inputs.current
    if inputs.in_flight is not None:
        return _hold(inputs, f"a change is in flight ({inputs.in_flight})", error)
    if inputs.serving != current:
        return _hold(
            inputs,
            f"{inputs.serving.describe()} of {current.describe()} serve: waiting until every "
            "instance serves",
            error,
        )
    if inputs.stalled >= limits.min_requests and inputs.observed is None:
        return _stalled(limits, memory, inputs, error)
    if inputs.requests < limits.min_requests:
        return _hold(
            inputs,
            f"{inputs.requests} request(s) in the interval, fewer than min_requests "
            f"{limits.min_requests}: too few to judge the workload",
            error,
        )
    if inputs.observed is None or inputs.forecast is None:
        return _hold(
            inputs,
            f"{inputs.requests} request(s) in the interval but the workers' metrics do not show "
            "their lengths (the prefills or the decodes finished none in it, or their /metrics "
            "did not answer, or --enable-metrics is missing)",
            error,
        )
    if memory.mispredicted >= limits.mispredicted_intervals:
        return Decision(
            "paused",
            current,
            current,
            f"forecasts off by more than {limits.prediction_error:.0%} (plus the sampling "
            f"noise of the interval's requests) for {memory.mispredicted} interval(s) in a row "
            f"(last {error or 0:.0%}): not acting until a forecast holds again",
            current_goodput=inputs.goodput.get(current),
            error=error,
        )
    cooling = _cooling(limits, memory, inputs)
    if cooling is not None:
        return _hold(inputs, cooling, error)
    allowed = candidates(limits, current, inputs.serving)
    rated = [(inputs.goodput[s], s) for s in allowed if s in inputs.goodput]
    if current not in inputs.goodput or not rated:
        return _hold(inputs, "no prediction for the current split", error)
    here = inputs.goodput[current]
    best_goodput, best = max(rated, key=lambda pair: (pair[0], pair[1] == current))
    if best_goodput <= 0:
        return _hold(
            inputs,
            f"no allowed split meets the SLO by the model for {inputs.forecast.describe()}: "
            "nothing to gain by moving",
            error,
        )
    if best == current:
        return _hold(
            inputs,
            f"{current.describe()} is the best allowed split ({here:.2f} req/s predicted "
            f"for {inputs.forecast.describe()})",
            error,
        )
    if best_goodput <= here * (1 + limits.hysteresis):
        return _hold(
            inputs,
            f"{best.describe()} predicts {best_goodput:.2f} req/s against "
            f"{current.describe()}'s {here:.2f}: within the hysteresis of "
            f"{limits.hysteresis:.0%}",
            error,
        )
    gain = best_goodput / here - 1 if here > 0 else float("inf")
    role = "decode to prefill" if best.prefill > current.prefill else "prefill to decode"
    moved = abs(best.prefill - current.prefill)
    return Decision(
        "move",
        current,
        best,
        f"{best.describe()} predicts {best_goodput:.2f} req/s against {current.describe()}'s "
        f"{here:.2f} ({gain:+.0%}) for {inputs.forecast.describe()}: move {moved} "
        f"instance(s) from {role}",
        current_goodput=here,
        target_goodput=best_goodput,
        error=error,
    )
