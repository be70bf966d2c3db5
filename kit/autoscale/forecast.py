"""The forecast of the next interval's workload: an exponentially weighted moving average that
restarts at a step change.

Each of the rate and the two mean lengths is forecast as
``next = ALPHA x observed + (1 - ALPHA) x previous forecast`` (the first forecast is the first
observation). When an interval is off the previous forecast by more than `reset` (the
topology's `prediction_error`, 0.5 is 50%, plus the interval's sampling noise:
`Limits.tolerance`; the same measure as `Mix.error`), the workload has
changed rather than wobbled and the forecast restarts from that interval: a plain average would
lag a shift for several intervals (a mean output of 300 tokens falling to 8 is still forecast at
80 two intervals later) and the engine would take its own lag for a failing model and stop
acting. A steady workload's forecast wobbles by half its noise. An interval with too few
requests (`min_requests`) leaves the forecast as it was: a quiet interval says little.
"""

from __future__ import annotations

from kit.autoscale.decide import Mix

ALPHA = 0.5


def forecast(
    previous: Mix | None, observed: Mix | None, alpha: float = ALPHA, reset: float | None = None
) -> Mix | None:
    """The next interval's workload from this one's `observed` and the `previous` forecast."""
    if observed is None:
        return previous
    if previous is None or (reset is not None and previous.error(observed) > reset):
        return observed

    def blend(now: float, before: float) -> float:
        return alpha * now + (1 - alpha) * before

    return Mix(
        blend(observed.rate, previous.rate),
        blend(observed.input_tokens, previous.input_tokens),
        blend(observed.output_tokens, previous.output_tokens),
    )
