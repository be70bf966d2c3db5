"""The schema of `autoscale:` (shape only; `autoscale_checks` checks its meaning)."""

from __future__ import annotations

from pydantic import Field

from kit.topology.strict import Strict


class AutoscaleRole(Strict):
    """How few and how many instances of one role `pdkit autoscale` may leave serving."""

    min: int = Field(1, ge=1, description="Fewest instances of the role (at least 1).")
    max: int | None = Field(
        None,
        ge=1,
        description="Most instances of the role; default: the pool less the other role's min.",
    )


class Autoscale(Strict):
    """`pdkit autoscale`: keep the prefill:decode split of a fixed pool of instances (the
    topology's prefill.count + decode.count, all of one size) right as the workload moves.
    Every `interval_s` it reads the router's and workers' metrics, corrects kit/perf's model by
    what it observed, forecasts the next interval and moves up to `max_step` instances from one
    role to the other when the model says that split's goodput under `slo:` beats the current
    one's by more than `hysteresis`."""

    prefill: AutoscaleRole = Field(
        default_factory=AutoscaleRole, description="Bounds on the prefill instances."
    )
    decode: AutoscaleRole = Field(
        default_factory=AutoscaleRole, description="Bounds on the decode instances."
    )
    interval_s: float = Field(
        30.0, ge=1, le=3600, description="Seconds between two reads of the metrics (one decision)."
    )
    hysteresis: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Least gain in predicted goodput (0.15: 15%) that justifies a move.",
    )
    cooldown_s: float = Field(
        120.0, ge=0, description="Seconds after a change during which no other change is made."
    )
    max_step: int = Field(
        1, ge=1, description="Most instances moved from one role to the other in one change."
    )
    prediction_error: float = Field(
        0.5,
        gt=0,
        description="Relative error of the forecast (request rate and lengths, 0.5: 50%) "
        "beyond which an interval counts as mispredicted; an interval of n finished requests "
        "is allowed 2/sqrt(n) more for sampling noise.",
    )
    mispredicted_intervals: int = Field(
        3,
        ge=1,
        description="Consecutive mispredicted intervals after which the autoscaler stops "
        "acting (it keeps reading and says why) until its forecasts hold again.",
    )
    min_requests: int = Field(
        20,
        ge=1,
        description="Fewest requests an interval must have finished for a decision: a quieter "
        "interval holds the split.",
    )
