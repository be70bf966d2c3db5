"""The environment keys of engine sim that pdkit reads outside the emulator, and their rule.

A topology of engine sim sets them in a role's `env:` (or `defaults.env`); the Plan reads them
into each instance's launch record (`kit.plan.launch`), and the sim reads the same keys with
the same rule when it starts (`kit.sim.settings`, which documents every ``PDKIT_SIM_*`` key).
Both import them from here, below both, so that the Plan does not depend on the emulator.

    PDKIT_SIM_GPU     the GPU the sim emulates (a role's env may set it over the host's
                      gpu_type)
    PDKIT_SIM_SPEED   model seconds per wall second: a positive number, default 1
"""

from __future__ import annotations

import math
from collections.abc import Mapping

SIM_GPU_ENV = "PDKIT_SIM_GPU"
SPEED_ENV = "PDKIT_SIM_SPEED"


class SettingsError(ValueError):
    """An environment variable holds a value the sim cannot use."""


def speed_from_env(env: Mapping[str, str]) -> float:
    """``PDKIT_SIM_SPEED`` (model seconds per wall second; default 1); `SettingsError` when it
    is not a positive number. The Plan reads it from the topology with the same rule."""
    return env_number(env, SPEED_ENV, 1.0, minimum=1e-6)


def env_number(
    env: Mapping[str, str], name: str, default: float, minimum: float = -math.inf
) -> float:
    """The number in `env[name]` (`default` when unset or blank); `SettingsError` naming the
    variable when it is no finite number of at least `minimum`."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise SettingsError(f"{name}={raw!r} must be a finite number >= {minimum:g}")
    return value


def env_integer(env: Mapping[str, str], name: str, default: int, minimum: int | None = None) -> int:
    """The integer in `env[name]` (`default` when unset or blank); `SettingsError` naming the
    variable when it is no integer of at least `minimum`."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={raw!r} must be >= {minimum}")
    return value
