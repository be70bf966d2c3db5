"""What bench-chaos counts per row, shared by its cluster rows (`bench_chaos`) and its rows on a
deployment made by `pdkit up` (`chaos_deployed`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Row:
    fault: str
    router: str
    shape: str
    sent: int = 0
    failed: int = 0
    retried: str = "n/a"
    migrated: str = "n/a"
    held: str = "n/a"
    ttft_p99: float | None = None
    tpot_p99: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    below: dict[str, float] = field(default_factory=dict)
    """Seconds each role ran below its instance count (operator rows that replace workers)."""
    away_s: float | None = None
    """kill-rank: seconds the killed rank's instance did not answer /health."""


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def counters(url: str) -> dict[str, float]:
    """pdkit's retries, migrations and holds so far (sums over labels)."""
    out = {"retries": 0.0, "migrations": 0.0, "held": 0.0}
    names = {
        "pdkit_lb_retries_total": "retries",
        "pdkit_lb_migrations_total": "migrations",
        "pdkit_lb_held_total": "held",
    }
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        m = re.match(r"^(pdkit_lb_\w+_total)(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m and m.group(1) in names:
            out[names[m.group(1)]] += float(m.group(2))
    return out


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"
