"""Checks of `autoscale:`: the pool of instances it moves between roles, and its bounds.

The pool is the topology's prefill.count + decode.count instances; an instance changes role
in place, so both roles must use instances of the same size (GPUs per instance), and the
bounds must leave every split they allow inside the pool.
"""

from __future__ import annotations

from collections.abc import Iterator

from kit.errors import Problem
from kit.topology.schema import ROLE_NAMES, Topology


def role_bounds(topology: Topology, role: str) -> tuple[int, int]:
    """(fewest, most) instances of `role` autoscale may leave serving (the defaults resolved:
    max is the pool less the other role's min)."""
    scale = topology.autoscale
    pool = topology.prefill.count + topology.decode.count
    if scale is None:
        count = getattr(topology, role).count
        return count, count
    other = "decode" if role == "prefill" else "prefill"
    bounds = getattr(scale, role)
    most = bounds.max if bounds.max is not None else pool - getattr(scale, other).min
    return bounds.min, most


def autoscale_problems(topology: Topology) -> Iterator[Problem]:
    """Every problem of the `autoscale:` section (none when it is absent)."""
    scale = topology.autoscale
    if scale is None:
        return
    sizes = {role: getattr(topology, role).gpus_per_instance for role in ROLE_NAMES}
    if sizes["prefill"] != sizes["decode"]:
        yield Problem(
            ("autoscale",),
            f"prefill instances use {sizes['prefill']} GPU(s) each and decode instances "
            f"{sizes['decode']}; an instance can only change role into one of its own size.",
            "give prefill and decode the same tp, dp, ep and pp, or remove autoscale:.",
        )
    pool = topology.prefill.count + topology.decode.count
    if scale.prefill.min + scale.decode.min > pool:
        yield Problem(
            ("autoscale", "prefill", "min"),
            f"prefill min {scale.prefill.min} + decode min {scale.decode.min} is more than the "
            f"pool's {pool} instance(s) (prefill.count + decode.count).",
            f"lower the mins to a sum of at most {pool}, or raise the counts.",
        )
        return
    for role in ROLE_NAMES:
        low, high = role_bounds(topology, role)
        other = "decode" if role == "prefill" else "prefill"
        bounds = getattr(scale, role)
        if bounds.max is not None and bounds.max < bounds.min:
            yield Problem(
                ("autoscale", role, "max"),
                f"max {bounds.max} is below min {bounds.min}.",
                f"set autoscale.{role}.max to at least {bounds.min}.",
            )
            continue
        if bounds.max is not None and bounds.max > pool - getattr(scale, other).min:
            yield Problem(
                ("autoscale", role, "max"),
                f"max {bounds.max} leaves fewer than autoscale.{other}.min "
                f"{getattr(scale, other).min} of the pool's {pool} instance(s).",
                f"set autoscale.{role}.max to at most {pool - getattr(scale, other).min}.",
            )
            continue
        count = getattr(topology, role).count
        if not low <= count <= high:
            yield Problem(
                (role, "count"),
                f"{count} is outside autoscale.{role}'s bounds [{low}, {high}].",
                f"set {role}.count within [{low}, {high}], or widen autoscale.{role}.",
            )
