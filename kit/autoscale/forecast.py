"""The forecast of the next interval's workload: an exponentially weighted moving average.

Each of the rate and the two mean lengths is forecast as
``next = ALPHA x observed + (1 - ALPHA) x previous forecast`` (the first forecast is the first
observation). With ALPHA 0.5 a step change in the workload is three quarters absorbed after
two intervals; a steady workload's forecast wobbles by half its noise. An interval with too few
requests (`min_requests`) leaves the forecast as it was: a quiet interval says little about the
mix.
"""

from __future__ import annotations

from kit.autoscale.decide import Mix

ALPHA = 0.5


def forecast(previous: Mix | None, observed: Mix | None, alpha: float = ALPHA) -> Mix | None:
    """The next interval's workload from this one's `observed` and the `previous` forecast."""
    if observed is None:
        return previous
    if previous is None:
        return observed

    def blend(now: float, before: float) -> float:
        return alpha * now + (1 - alpha) * before

    return Mix(
        blend(observed.rate, previous.rate),
        blend(observed.input_tokens, previous.input_tokens),
        blend(observed.output_tokens, previous.output_tokens),
    )
