"""`make bench-lb`: pdkit's PD load balancer against sglang-router's mini_lb, smg, and no router.

The same load goes to each target in one run, in front of the same fake PD workers
(`tests.support.fake_worker`, the load balancer tests' fake: it checks the PD protocol as it
serves):
- `direct`: straight to one non-PD fake worker (the floor: no routing at all);
- `pdkit`: `python -m kit.lb` (this repo), default policies, access log on (its default);
- `pdkit_nolog`: the same with `--no-access-log`, so the report can say what the log costs;
- `mini_lb`: `python -m sglang_router.launch_router --pd-disaggregation --mini-lb` (0.3.2);
- `smg`: `smg launch --pd-disaggregation` (1.13.0), default policies.

Fairness on a shared 2-core machine: each router is pinned to CPU 1 (only the one under test is
busy); the fake workers (one separate process on raw asyncio HTTP) and this load generator
share CPU 0. Targets are measured in interleaved rounds so that they all see the same
background noise. Results are ratios against the direct
path and between routers in the same run, never absolute targets.

For each target and for non-streaming and streaming `/generate` (`--tokens` events per stream):
- throughput: `--concurrency` clients in a closed loop for `--seconds`: requests/s, and the
  router's CPU time per request (/proc/PID/stat utime + stime, all threads, over exactly the
  measured window), whose inverse is the requests one whole core would serve;
- added latency: `--latency-requests` arriving at `--latency-rate`/s (Poisson, open loop, far
  below every router's capacity): p50/p99 of end-to-end latency (non-streaming) or time to the
  first chunk (streaming), minus the direct path's.

Venvs: PDKIT_SGLANG_ROUTER_PYTHON (default .venv-sglang-router/bin/python) and PDKIT_SMG
(default .venv-smg/bin/smg); a target whose venv is missing is skipped with a note. Router logs
go to .bench/lb/NAME.log. The report ends with the fake workers' headroom: the requests one core
of them serves, direct and routed (both legs), against the fastest router's rate, and any PD
protocol problem they saw.

Then the text workloads (`benchmarks.lbbench.text`): OpenAI chat with a long shared system prompt
and completions, through pdkit with the model's tokenizer, pdkit without one and smg, the
router's CPU per request side by side (`--no-text` skips them); and, in this process, the
router's CPU for a 4,000-token prompt's ids and block hashes (`benchmarks.lbbench.prompt_cpu`).

Modules: `benchmarks.lbbench` (cpu, load, targets, measure, report, text, prompt_cpu); this file
runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence

from benchmarks.lbbench.cpu import pin
from benchmarks.lbbench.load import LoadResult
from benchmarks.lbbench.measure import Measured, measure_round, request_body
from benchmarks.lbbench.prompt_cpu import lines, measure
from benchmarks.lbbench.report import report
from benchmarks.lbbench.targets import LOG_DIR, NAMES, Target, start, stop, targets
from benchmarks.lbbench.text import report_text, run_text, tokenizer_model
from tests.support.fake_worker import FakeWorkerProcess


async def run(args: argparse.Namespace) -> int:
    pinned = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    router_cpu, loadgen_cpu = (1, 0) if pinned else (None, None)
    pin(loadgen_cpu)
    fakes = FakeWorkerProcess(
        args.prefills,
        args.decodes,
        nulls=1,
        token_delay=args.token_delay,
        cpu=loadgen_cpu,
        log_path=LOG_DIR / "fake_workers.log",
    ).start()
    notes: dict[str, str] = {}
    running: list[Target] = []
    policies: dict[str, str] = {}
    results: dict[str, dict[bool, Measured]] = {}
    text: dict[str, dict[str, LoadResult]] = {}
    try:
        for target in targets(args.targets, fakes):
            policies[target.name] = target.policies
            print(f"[{target.name}] starting", flush=True)
            if await start(target, router_cpu, loadgen_cpu):
                running.append(target)
                results[target.name] = {False: Measured(), True: Measured()}
            else:
                notes[target.name] = target.note
                print(f"[{target.name}] {target.note}", flush=True)
                await stop(target)
        # Interleaved rounds: every target sees the same background noise of a shared machine.
        for round_no in range(1, args.rounds + 1):
            for stream in (False, True):
                body = request_body(stream, args.tokens)
                for target in running:
                    into = results[target.name][stream]
                    await measure_round(target, body, args, stream, into, fake_pid=fakes.pid)
            print(f"round {round_no}/{args.rounds} done", flush=True)
        for target in running:
            await stop(target)
        running = []
        if not args.no_text:
            text = await run_text(args, fakes, router_cpu, loadgen_cpu)
    finally:
        for target in running:
            await stop(target)
        summary = fakes.stop()
    report(results, notes, policies, args, pinned=pinned, fakes=summary)
    if text:
        report_text(text, args)
    print()
    print("\n".join(lines(measure(tokenizer_model(LOG_DIR / "tiny-tokenizer")))))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_lb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--targets",
        default=",".join(NAMES),
        help=f"comma-separated subset of {','.join(NAMES)}",
    )
    p.add_argument("--prefills", type=int, default=2)
    p.add_argument("--decodes", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16, help="tokens (stream events) per request")
    p.add_argument(
        "--token-delay",
        type=float,
        default=0.001,
        help="seconds between streamed tokens (default 0.001)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=6.0,
        help="throughput phase length per target and mode, over all rounds (s)",
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument(
        "--latency-rate",
        type=float,
        default=200.0,
        help="arrivals per second of the latency phase (Poisson, open loop; default 200)",
    )
    p.add_argument(
        "--latency-requests",
        type=int,
        default=2000,
        help="requests of the latency phase, over all rounds (default 2000)",
    )
    p.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds over the targets (default 6)"
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--no-text", action="store_true", help="skip the text workloads")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=4000,
        help="text workloads: tokens of the shared system prompt (chat) and of each completions "
        "prompt (default 4000)",
    )
    p.add_argument(
        "--text-bodies",
        type=int,
        default=600,
        help="text workloads: the completions prompts sent in turn, each new to the router's "
        "caches when they are more than its segment cache holds (1M tokens; default 600)",
    )
    args = p.parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up for the load generator

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
