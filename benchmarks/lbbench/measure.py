"""One measuring round per target and mode (a throughput phase, then a latency phase), and the
sums over rounds, with the CPU time of the router and of the fake workers."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from benchmarks.lbbench.load import LoadResult, closed_loop, open_loop
from benchmarks.lbbench.targets import Target


@dataclass
class Measured:
    """One target, one mode, summed over rounds: throughput and latency phases, and the CPU
    seconds over the throughput phases of the router, the fake workers and the load generator."""

    throughput: LoadResult = field(default_factory=LoadResult)
    latency: LoadResult = field(default_factory=LoadResult)
    cpu: float = 0.0
    fake_cpu: float = 0.0
    loadgen_cpu: float = 0.0

    @property
    def cpu_per_request(self) -> float | None:
        """Router CPU seconds per request (None for the direct path)."""
        return self.cpu / self.throughput.done if self.cpu and self.throughput.done else None

    @property
    def fake_cpu_per_request(self) -> float | None:
        """The fake workers' CPU seconds per request (both legs for a routed one)."""
        done = self.throughput.done
        return self.fake_cpu / done if self.fake_cpu and done else None

    def add(self, throughput: LoadResult, latency: LoadResult) -> None:
        for total, part in ((self.throughput, throughput), (self.latency, latency)):
            total.done += part.done
            total.errors += part.errors
            total.seconds += part.seconds
            total.latencies += part.latencies
            total.firsts += part.firsts
        self.cpu += throughput.cpu.get("router", 0.0)
        self.fake_cpu += throughput.cpu.get("fake", 0.0)
        self.loadgen_cpu += throughput.cpu.get("loadgen", 0.0)


async def measure_round(
    target: Target,
    body: bytes,
    args: argparse.Namespace,
    stream: bool,
    into: Measured,
    *,
    fake_pid: int,
) -> None:
    """One round for one target and mode: a throughput phase, then a latency phase."""
    concurrency = args.stream_concurrency if stream else args.concurrency
    events = args.tokens + 1 if stream else 0
    watch = {"fake": fake_pid}
    if target.proc is not None:
        watch["router"] = target.proc.pid
    throughput = await closed_loop(
        target.port,
        body,
        concurrency,
        seconds=args.seconds / args.rounds,
        events=events,
        watch=watch,
    )
    latency = await open_loop(
        target.port,
        body,
        args.latency_rate,
        max(args.latency_requests // args.rounds, 1),
        events=events,
        seed=len(into.latency.latencies) + 1,
    )
    into.add(throughput, latency)


def request_body(stream: bool, tokens: int) -> bytes:
    """The /generate body every target gets: a short chat-like prompt, `tokens` new tokens."""
    prompt = ("You are a helpful assistant. Answer briefly. " * 4) + "What is PD disaggregation?"
    return json.dumps(
        {
            "text": prompt,
            "stream": stream,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
        }
    ).encode()
