"""`make bench-limits`: does a client over its token bucket leave the other client its share?

pdkit's router (`python -m kit.lb`) in front of fake PD workers (`tests.support.fake_worker`,
one background process) whose capacity is bounded by the router's --prefill-max-inflight:
each prefill leg takes `--latency` s and at most `--slots` are out on each prefill, so the
deployment serves about prefills x slots / latency requests/s. Two clients, each limited to
`--limit` requests/s (router.limits, rendered as --client-limits):

1. `alone`: the polite client alone at `--rate` requests/s (Poisson, open loop, streams);
2. `limited`: the same, and the greedy client at 5x its limit at once;
3. `unlimited`: the same two clients with no limits (the router's own key): what the greedy
   one does to the other when nothing stops it.

For each: the polite client's goodput (streams answered 200 whose first token came within
`--ttft-slo-ms`, per second), its TTFT p90, and the greedy client's 200s and 429s. Target:
the polite client's goodput with the greedy one limited stays within 10% of its run alone.
All three runs in one process tree, interleaved over `--rounds` (a shared machine's noise).

    python -m benchmarks.bench_limits [--seconds 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.support.fake_worker import FakeWorkerProcess
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
LOG_DIR = REPO / ".bench" / "limits"
POLITE, GREEDY = "sk-polite-bench", "sk-greedy-bench"
ROUTER_KEY = "sk-router-bench"
TARGET = 0.9
BODY = json.dumps(
    {
        "text": "You are a helpful assistant. " * 8 + "What is PD disaggregation?",
        "stream": True,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
    }
).encode()


@dataclass
class ClientRun:
    """What one client saw in one run: statuses and the TTFT (s) of each 200."""

    statuses: list[int] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def goodput(self, slo: float) -> float:
        return sum(1 for t in self.ttfts if t <= slo) / self.seconds if self.seconds else 0.0

    def p90(self) -> float:
        if not self.ttfts:
            return float("nan")
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


async def one(session: aiohttp.ClientSession, url: str, key: str, into: ClientRun) -> None:
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        async with session.post(url + "/generate", data=BODY, headers=headers) as resp:
            first = None
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
            into.statuses.append(resp.status)
            if resp.status == 200 and first is not None:
                into.ttfts.append(first - started)
    except aiohttp.ClientError:
        into.statuses.append(0)


async def open_loop(url: str, key: str, rate: float, seconds: float, seed: int) -> ClientRun:
    """Poisson arrivals at `rate`/s for `seconds`; waits for every answer."""
    rng = random.Random(seed)
    out = ClientRun(seconds=seconds)
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        at = 0.0
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, url, key, out)))
        await asyncio.gather(*tasks)
    return out


async def start_router(argv: list[str], port: int, name: str) -> asyncio.subprocess.Process:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / f"{name}.log").open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=REPO, stdout=sink, stderr=asyncio.subprocess.STDOUT
        )
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(f"http://127.0.0.1:{port}/readiness") as resp:
                    if resp.status == 200:
                        return proc
            except aiohttp.ClientError:
                pass
            if proc.returncode is not None:
                raise SystemExit(f"the router exited; see {LOG_DIR / name}.log")
            await asyncio.sleep(0.1)
    raise SystemExit("the router is not ready within 30 s")


async def run(args: argparse.Namespace) -> int:
    fakes = FakeWorkerProcess(
        args.prefills, 1, latency=args.latency, token_delay=0.002, log_path=LOG_DIR / "fake.log"
    ).start()
    workers: list[str] = []
    for url, bootstrap in fakes.prefills:
        workers += ["--prefill", url, str(bootstrap)]
    for url in fakes.decodes:
        workers += ["--decode", url]
    limits = ",".join(
        f"{name}={hashlib.sha256(key.encode()).hexdigest()}:{args.limit:g}:0:1"
        for name, key in (("polite", POLITE), ("greedy", GREEDY))
    )
    port = free_port()
    argv = [sys.executable, "-m", "kit.lb", *workers, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--prefill-max-inflight", str(args.slots), "--no-access-log", "--log-level", "warning"]
    argv += ["--client-limits", limits]
    url = f"http://127.0.0.1:{port}"
    env_key = {"alone": POLITE, "limited": GREEDY, "unlimited": ROUTER_KEY}
    results: dict[str, list[tuple[ClientRun, ClientRun | None]]] = {k: [] for k in env_key}
    os.environ["PDKIT_LB_API_KEY"] = ROUTER_KEY  # the router reads its key from there
    router = await start_router(argv, port, "router")
    try:
        for round_no in range(args.rounds):
            for mode in ("alone", "limited", "unlimited"):
                seed = 1000 * round_no
                polite_key = ROUTER_KEY if mode == "unlimited" else POLITE
                polite = open_loop(url, polite_key, args.rate, args.seconds, seed)
                if mode == "alone":
                    results[mode].append((await polite, None))
                else:
                    greedy_rate = 5 * args.limit
                    both = await asyncio.gather(
                        polite, open_loop(url, env_key[mode], greedy_rate, args.seconds, seed + 1)
                    )
                    results[mode].append((both[0], both[1]))
                await asyncio.sleep(1.5)  # the buckets refill, the queues drain
            print(f"round {round_no + 1}/{args.rounds} done", flush=True)
    finally:
        router.send_signal(signal.SIGTERM)
        await router.wait()
        fakes.stop()
    report(results, args)
    return 0


def merged(runs: Sequence[ClientRun]) -> ClientRun:
    out = ClientRun()
    for r in runs:
        out.statuses += r.statuses
        out.ttfts += r.ttfts
        out.seconds += r.seconds
    return out


def report(
    results: dict[str, list[tuple[ClientRun, ClientRun | None]]], args: argparse.Namespace
) -> None:
    slo = args.ttft_slo_ms / 1000
    capacity = args.prefills * args.slots / args.latency
    print(
        f"\nbench-limits: {args.prefills} prefills x {args.slots} slots / "
        f"{args.latency * 1000:g} ms "
        f"= ~{capacity:g} req/s; both clients limited to {args.limit:g} req/s; polite at "
        f"{args.rate:g}/s, greedy at {5 * args.limit:g}/s (5x); {args.rounds} rounds x "
        f"{args.seconds:g} s; goodput = 200s with TTFT <= {args.ttft_slo_ms:g} ms, per s\n"
    )
    print(
        f"{'run':<10} {'polite goodput':>15} {'TTFT p90 ms':>12} "
        f"{'greedy 200':>11} {'greedy 429':>11}"
    )
    base = merged([p for p, _ in results["alone"]])
    rows = {}
    for mode, runs in results.items():
        polite = merged([p for p, _ in runs])
        greedies = [g for _, g in runs if g is not None]
        greedy = merged(greedies) if greedies else None
        rows[mode] = polite
        ok = greedy.statuses.count(200) if greedy else 0
        refused = greedy.statuses.count(429) if greedy else 0
        print(
            f"{mode:<10} {polite.goodput(slo):>15.2f} {polite.p90() * 1000:>12.1f} "
            f"{ok if greedy else '-':>11} {refused if greedy else '-':>11}"
        )
    for mode in ("limited", "unlimited"):
        good = rows[mode].goodput(slo) / base.goodput(slo) if base.goodput(slo) else float("nan")
        ttft = rows[mode].p90() / base.p90()
        print(f"{mode}/alone: polite goodput x{good:.3f}, TTFT p90 x{ttft:.2f}")
    ratio = rows["limited"].goodput(slo) / base.goodput(slo) if base.goodput(slo) else 0.0
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(
        f"target (polite goodput with the greedy client limited >= {TARGET:.0%} of alone): "
        f"{verdict}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_limits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prefills", type=int, default=2)
    p.add_argument("--slots", type=int, default=2, help="--prefill-max-inflight (default 2)")
    p.add_argument("--latency", type=float, default=0.05, help="prefill leg, s (default 0.05)")
    p.add_argument("--limit", type=float, default=20.0, help="each client's requests/s")
    p.add_argument(
        "--rate", type=float, default=10.0, help="the polite client's requests/s (default 10)"
    )
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ttft-slo-ms", type=float, default=250.0)
    args = p.parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
