"""Synthetic workloads for virtual-time runs: requests with an arrival time and lengths.

A sweep takes a `WorkloadFactory`, ``rate -> requests``, so that callers choose the length
distribution and the arrival process; `fixed_poisson` is the common case (fixed lengths,
Poisson arrivals).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One synthetic request: arrival (s from the start), prompt and output lengths (tokens)."""

    arrival: float
    prompt_len: int
    output_len: int


WorkloadFactory = Callable[[float], Sequence[Request]]
"""The requests to serve at a rate (requests/s), in arrival order."""


def poisson_arrivals(
    rate: float, lengths: Iterable[tuple[int, int]], seed: int = 0
) -> list[Request]:
    """One request per (prompt, output) length pair, with exponential inter-arrival times at
    `rate` requests/s. The same seed gives the same gaps (scaled by 1/rate) at every rate."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, not {rate}")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for prompt_len, output_len in lengths:
        t += rng.expovariate(rate)
        out.append(Request(t, prompt_len, output_len))
    return out


def poisson_workload(
    rate: float, count: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[Request]:
    """`count` requests of fixed lengths (tokens), Poisson arrivals at `rate` requests/s."""
    return poisson_arrivals(rate, [(prompt_len, output_len)] * count, seed)


def fixed_poisson(
    prompt_len: int, output_len: int, *, requests: int = 1000, seed: int = 0
) -> WorkloadFactory:
    """A factory of `requests` requests of fixed lengths (tokens) arriving as a Poisson
    process at the rate asked."""

    def at(rate: float) -> list[Request]:
        return poisson_workload(rate, requests, prompt_len, output_len, seed)

    return at
