"""`make bench-routing`: does routing on the prefills' KV events (`cache_aware`) reuse more
prefix tokens and answer sooner than hashing the prompt (`prefix_affinity`) and than smg 1.13's
`cache_aware`?

Emulated workers (`python -m kit.sim`, PD over Mooncake on loopback) that keep a radix cache
and publish SGLang's KV events (`--kv-events-config`), in two layouts:

- `2P1D`: two prefills and one decode;
- `DP prefill`: one prefill with 2 DP-attention ranks (`--tp-size 2 --dp-size 2
  --enable-dp-attention`, each rank its own cache) and one decode.

For each layout and router, fresh workers (empty caches), then one workload: `--groups`
shared prefixes (a document of `--prefix-tokens` tokens each) with `--questions` questions
each, group popularity skewed (Zipf 1.0), sent in random order as streamed `/generate`
requests at `--rate` requests/s (Poisson arrivals); or (`--workload trace`) a Mooncake-style
trace of `hash_ids` blocks: multi-turn conversations whose every turn repeats the history.
Reported per run:

- reuse: cached prompt tokens / prompt tokens, from the prefills' own counters
  (`sglang:cached_tokens_total`, `sglang:prompt_tokens_total`);
- TTFT p50 / p90 at the client;
- goodput: requests/s that met the SLO (TTFT <= `--slo-ttft-ms`, TPOT <= `--slo-tpot-ms`);
- the router's CPU per request (its process' user + system time / requests).

    python -m benchmarks.bench_routing [--groups 16] [--questions 8] [--prefix-tokens 4000]
        [--rate 8] [--speed 0.25] [--out DIR]

smg runs from PDKIT_SMG (default .venv-smg/bin/smg); without it, its rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kit.bench.prompts import block_text
from kit.perf.workload import multi_turn_hash_ids
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, worker_argv

REPO = Path(__file__).resolve().parent.parent
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_GPU": "H100-SXM"}
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
]
ROUTERS = ("pdkit prefix_affinity", "pdkit cache_aware", "smg cache_aware")
LAYOUTS = ("2P1D", "DP prefill")


@dataclass
class Result:
    layout: str
    router: str
    requests: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    good: int = 0
    seconds: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    router_cpu_s: float = 0.0

    def row(self) -> dict[str, Any]:
        ttft = sorted(self.ttft)

        def q(p: float) -> float | None:
            return ttft[min(len(ttft) - 1, int(p * len(ttft)))] * 1000 if ttft else None

        return {
            "layout": self.layout,
            "router": self.router,
            "requests": self.requests,
            "failed": self.failed,
            "reuse": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "ttft_p50_ms": q(0.5),
            "ttft_p90_ms": q(0.9),
            "goodput_rps": self.good / self.seconds if self.seconds else 0.0,
            "router_cpu_ms_per_request": self.router_cpu_s * 1000 / max(self.requests, 1),
        }


def kv_events(port: int) -> list[str]:
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    return ["--kv-events-config", json.dumps(config)]


def workers(
    layout: str, log_dir: Path, speed: float
) -> tuple[list[tuple[SimProcess, int]], SimProcess]:
    env = {**SIM_ENV, "PDKIT_SIM_SPEED": f"{speed:g}"}
    if layout == "2P1D":
        shapes: list[list[str]] = [[], ["--base-gpu-id", "1"]]
        decode_gpu = "2"
    else:
        shapes = [["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]]
        decode_gpu = "2"
    prefills = []
    for extra in shapes:
        boot = free_port()
        argv = worker_argv(
            port=free_port(),
            mode="prefill",
            bootstrap_port=boot,
            model=MODEL,
            extra=[*kv_events(free_port()), *extra],
        )
        prefills.append((SimProcess(argv, env=env, log_dir=log_dir), boot))
    decode = SimProcess(
        worker_argv(
            port=free_port(),
            mode="decode",
            model=MODEL,
            extra=["--base-gpu-id", decode_gpu, "--max-running-requests", "256"],
        ),
        env=env,
        log_dir=log_dir,
    )
    return prefills, decode


def router_argv(
    router: str, prefills: list[tuple[SimProcess, int]], decode: SimProcess, port: int
) -> list[str] | None:
    flags: list[str] = []
    for sim, boot in prefills:
        flags += ["--prefill", sim.url, str(boot)]
    flags += ["--decode", decode.url, "--host", "127.0.0.1", "--port", str(port)]
    kind, policy = router.split()
    if kind == "pdkit":
        return [
            sys.executable,
            "-m",
            "kit.lb",
            *flags,
            "--prefill-policy",
            policy,
            "--decode-policy",
            "least_inflight",
            "--no-access-log",
            "--log-level",
            "warning",
        ]
    smg = os.environ.get("PDKIT_SMG", str(REPO / ".venv-smg" / "bin" / "smg"))
    if not Path(smg).exists():
        return None
    return [
        smg,
        "launch",
        "--pd-disaggregation",
        *flags,
        "--prefill-policy",
        policy,
        "--decode-policy",
        "round_robin",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warn",
    ]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(prompt tokens, cached tokens) from a worker's /metrics."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    prompt = cached = 0.0
    for line in text.splitlines():
        if line.startswith("sglang:prompt_tokens_total"):
            prompt += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sglang:cached_tokens_total"):
            cached += float(line.rsplit(" ", 1)[1])
    return prompt, cached


def trace_workload(args: argparse.Namespace, seed: int) -> list[str]:
    """A Mooncake-style trace (`kit.perf.workload.multi_turn_hash_ids`: `--groups`
    conversations of `--questions` turns, each turn its history's blocks and one more), each
    block 512 tokens of `kit.bench.prompts.block_text`, the same text wherever the same id
    appears."""
    return [
        "".join(block_text(block) for block in blocks)
        for blocks in multi_turn_hash_ids(args.groups, args.questions, seed)
    ]


def workload(args: argparse.Namespace, seed: int) -> list[str]:
    if args.workload == "trace":
        return trace_workload(args, seed)
    rng = random.Random(seed)
    docs = []
    for g in range(args.groups):
        words = [rng.choice(WORDS) for _ in range(args.prefix_tokens * 4 // 6)]
        docs.append(f"Document {g}. " + " ".join(words) + "\n")
    weights = [1 / (g + 1) for g in range(args.groups)]
    prompts = []
    for i in range(args.groups * args.questions):
        g = rng.choices(range(args.groups), weights)[0]
        prompts.append(docs[g] + f"Question {i}: what does line {rng.randrange(99)} say?")
    return prompts


async def one(
    session: aiohttp.ClientSession, url: str, text: str, args: argparse.Namespace, out: Result
) -> None:
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": args.output}}
    started = time.monotonic()
    first = None
    events = 0
    try:
        async with session.post(url + "/generate", json=body) as response:
            if response.status != 200:
                out.failed += 1
                await response.read()
                return
            async for line in response.content:
                if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                    events += 1
                    if first is None:
                        first = time.monotonic()
    except aiohttp.ClientError:
        out.failed += 1
        return
    end = time.monotonic()
    if first is None:
        out.failed += 1
        return
    ttft = first - started
    tpot = (end - first) / (events - 1) if events > 1 else 0.0
    out.ttft.append(ttft)
    if (
        ttft * 1000 <= args.slo_ttft_ms / args.speed
        and tpot * 1000 <= args.slo_tpot_ms / args.speed
    ):
        out.good += 1


async def run_one(layout: str, router: str, args: argparse.Namespace, log_dir: Path) -> Result:
    result = Result(layout, router)
    prefills, decode = workers(layout, log_dir, args.speed)
    port = free_port()
    argv = router_argv(router, prefills, decode, port)
    if argv is None:
        return result
    sims = [sim for sim, _ in prefills] + [decode]
    proc: subprocess.Popen[bytes] | None = None
    try:
        for sim in sims:
            sim.start()
        for sim in sims:
            sim.wait_ready(60)
        with (log_dir / f"router-{port}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with session.get(url + "/readiness") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{router} did not get ready; see {log_dir}")
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # subscriptions (ZMQ's slow joiner) settle
            before = [await counters(session, sim.url) for sim, _ in prefills]
            cpu0 = cpu_seconds(proc.pid)
            prompts = workload(args, args.seed)
            rng = random.Random(args.seed + 1)
            tasks = []
            started = time.monotonic()
            for text in prompts:
                tasks.append(asyncio.create_task(one(session, url, text, args, result)))
                await asyncio.sleep(rng.expovariate(args.rate))
            await asyncio.gather(*tasks)
            result.seconds = time.monotonic() - started
            result.router_cpu_s = cpu_seconds(proc.pid) - cpu0
            result.requests = len(prompts)
            await asyncio.sleep(0.5)
            after = [await counters(session, sim.url) for sim, _ in prefills]
            result.prompt_tokens = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            result.cached_tokens = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for sim in sims:
            sim.stop()
    return result


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'layout':11} {'router':22} {'reqs':>5} {'fail':>4} {'reuse':>6} {'TTFT p50':>9} "
        f"{'TTFT p90':>9} {'goodput':>8} {'CPU/req':>8}"
    )
    for r in rows:
        print(
            f"{r['layout']:11} {r['router']:22} {r['requests']:5d} {r['failed']:4d} "
            f"{r['reuse']:6.1%} {fmt(r['ttft_p50_ms'], '7.0f')} ms {fmt(r['ttft_p90_ms'], '7.0f')}"
            f" ms {r['goodput_rps']:6.2f}/s {r['router_cpu_ms_per_request']:5.2f} ms"
        )
    print()
    for layout in LAYOUTS:
        by = {r["router"]: r for r in rows if r["layout"] == layout and r["requests"]}
        ours = by.get("pdkit cache_aware")
        if not ours:
            continue
        for other in ("pdkit prefix_affinity", "smg cache_aware"):
            base = by.get(other)
            if not base or not base["ttft_p90_ms"] or not ours["ttft_p90_ms"]:
                continue
            print(
                f"{layout}: cache_aware vs {other}: reuse {ours['reuse']:.1%} vs "
                f"{base['reuse']:.1%}, TTFT p90 x{ours['ttft_p90_ms'] / base['ttft_p90_ms']:.2f}, "
                f"goodput x{ours['goodput_rps'] / max(base['goodput_rps'], 1e-9):.2f}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--output", type=int, default=8, help="tokens generated per request")
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s")
    parser.add_argument("--slo-ttft-ms", type=float, default=400.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=40.0)
    parser.add_argument(
        "--speed",
        type=float,
        default=0.25,
        help="PDKIT_SIM_SPEED of the emulated GPUs (the SLO is stretched by 1 / speed)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workload",
        choices=("groups", "trace"),
        default="groups",
        help="groups: shared documents and questions; trace: multi-turn hash_ids blocks",
    )
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "routing")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for layout in args.layouts.split(","):
        for router in args.routers.split(","):
            result = asyncio.run(run_one(layout, router, args, args.out))
            if not result.requests:
                print(f"{layout} / {router}: skipped (router not installed)")
                continue
            rows.append(result.row())
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print()
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
