"""`make bench-bench`: is pdkit bench's load generator ever the bottleneck?

The same load goes straight to one fast fake worker (tests.support.fake_worker, its `null` role: an
OpenAI server with no model) from two clients in turn, in the same run:
- `raw`: the raw asyncio HTTP/1.1 client of `make bench-lb` (benchmarks.lbbench.load), the floor;
- `pdkit bench`: kit.bench's client and runner (aiohttp, every token timed and recorded).

Streaming: 200 concurrent streams in a closed loop; the time to the first token p50/p99 of
each, and what pdkit bench adds to it (target: under 1 ms at p50). Non-streaming: 64 clients
in a closed loop; requests/s and client CPU per request, whose inverse is what one core of
the client serves (target: 2,000 requests/s). The fake worker runs on CPU 0, the clients on
CPU 1 (one core each, in turn); results are ratios against the raw client measured in the same
run, never absolute promises.

    python -m benchmarks.bench_bench [--seconds 5] [--streams 200] [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.lbbench.cpu import cpu_tree_seconds, pin
from benchmarks.lbbench.load import closed_loop
from kit.aio import run
from kit.bench.client import Client, Target
from kit.bench.metrics import quantile
from kit.bench.runner import LoadSpec, run_point
from kit.perf.workload import Lengths, WorkloadSpec
from tests.support.fake_worker import FakeWorkerProcess

MODEL = "fake-model"


@dataclass
class Result:
    rate: float
    ttft_ms: list[float]
    cpu_s: float
    done: int

    def p(self, q: float) -> float:
        return quantile(self.ttft_ms, q) or float("nan")

    @property
    def cpu_per_request_ms(self) -> float:
        return self.cpu_s / self.done * 1000 if self.done else float("nan")


def body(stream: bool, tokens: int) -> bytes:
    data = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x " * 100}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    return json.dumps(data).encode()


async def raw(port: int, stream: bool, users: int, seconds: float, tokens: int) -> Result:
    path_body = body(stream, tokens)
    before = time.process_time()
    result = await closed_loop(port, path_body, users, seconds=seconds, path="/v1/chat/completions")
    cpu = time.process_time() - before
    return Result(result.rate, [f * 1000 for f in result.firsts], cpu, result.done)


async def pdkit_bench(url: str, stream: bool, users: int, seconds: float, tokens: int) -> Result:
    # Enough requests for the duration at the raw client's pace; prompts are built up front,
    # before the point's clock and CPU count start.
    spec = WorkloadSpec(input=Lengths.fixed(100), output=Lengths.fixed(tokens), count=8_000)
    load = LoadSpec(stream=stream, timeout_s=30, concurrency=users, duration_s=seconds)
    async with Client(Target(url, MODEL), 30) as client:
        point = await run_point(client, spec, None, load, run_id="bb")
    ok = [r for r in point.records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None and stream]
    cpu = point.load.client_cpu * point.wall_s  # over the load window only
    return Result(len(ok) / point.wall_s, ttfts, cpu, len(ok))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay", type=float, default=0.02)
    args = parser.parse_args(argv)
    two_cpus = (os.cpu_count() or 1) >= 2
    with FakeWorkerProcess(
        0, 0, 1, token_delay=args.token_delay, cpu=0 if two_cpus else None
    ) as fake:
        pin(1 if two_cpus else None)
        url = fake.nulls[0]
        port = int(url.rsplit(":", 1)[1])
        rows = []
        for stream, users in ((True, args.streams), (False, args.clients)):
            base = run(raw(port, stream, users, args.seconds, args.tokens))
            ours = run(pdkit_bench(url, stream, users, args.seconds, args.tokens))
            rows.append((stream, users, base, ours))
        fake_cpu = cpu_tree_seconds(fake.pid)
    print(f"make bench-bench: {args.seconds:g} s per phase, fake worker on CPU 0, clients on CPU 1")
    heads = ("load", "req/s", "TTFT p50", "TTFT p99", "cpu ms/req", "req/cpu-s")
    print(f"{'':14}" + "".join(f"{h:>11}" for h in heads))
    for stream, users, base, ours in rows:
        kind = "streaming" if stream else "non-streaming"
        print(f"{kind}")
        for name, r in (("raw", base), ("pdkit bench", ours)):
            per_core = 1000 / r.cpu_per_request_ms if r.done else 0
            ttft = f"{r.p(0.5):11.2f}{r.p(0.99):11.2f}" if stream else f"{'-':>11}{'-':>11}"
            load = f"{users} {'streams' if stream else 'clients'}"
            print(
                f"  {name:12}{load:>11}{r.rate:11.0f}{ttft}"
                f"{r.cpu_per_request_ms:11.3f}{per_core:11.0f}"
            )
    stream_row, plain_row = rows
    added = stream_row[3].p(0.5) - stream_row[2].p(0.5)
    added99 = stream_row[3].p(0.99) - stream_row[2].p(0.99)
    per_core = 1000 / plain_row[3].cpu_per_request_ms
    raw_per_core = 1000 / plain_row[2].cpu_per_request_ms
    print(
        f"pdkit bench adds {added:.2f} ms to TTFT p50 ({added99:.2f} ms p99) at "
        f"{args.streams} streams (target < 1 ms); it serves {per_core:.0f} non-streaming "
        f"requests/s per client core (target 2000), x{per_core / raw_per_core:.2f} the raw "
        f"client's; the fake used {fake_cpu:.1f} CPU-s in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
