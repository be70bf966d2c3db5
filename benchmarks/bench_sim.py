"""`make bench-sim`: what the sim's timing model says about PD disaggregation, and whether the
emulator keeps up with its own model.

Part 1 (virtual time, the worker's own scheduler and timing model): DistServe's Fig. 1
workload (Zhong et al., OSDI'24): Llama-2-13B on one A100-80G, 512 input / 64 output tokens,
Poisson arrivals. P90 TTFT and P90 TPOT against the request rate for a colocated instance, a
prefill-only and a decode-only instance; each one's goodput at 90% attainment of TTFT <= 400 ms
and TPOT <= 40 ms; the best xPyD on 3 GPUs against colocated, per GPU.

Part 2 (real time): one real sim worker (``python -m kit.sim``) serves N concurrent streams;
the client's observed TPOT is compared with the same burst in virtual time (the ratio is the
emulator's own overhead), and the worker's step-timer lag is printed.

    python -m benchmarks.bench_sim [--requests 800] [--streams 200] [--skip-live]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace

import aiohttp

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.sweep import goodput, percentile, rate_grid, run_rate
from kit.perf.timing import Efficiency, StepShape
from kit.perf.workload import fixed_poisson, poisson_workload
from kit.topology.schema import SLO
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, request_json, worker_argv

PROMPT, OUTPUT = 512, 64
DISTSERVE_SLO = SLO(ttft_ms=400, tpot_ms=40, attainment=0.9)
DISTSERVE = {
    "colocated": 1.6,
    "prefill-only": 5.6,
    "decode-only": 10.0,
    "2P1D per GPU": 3.3,
    "best / colocated": 2.1,
}
# Kernel efficiencies at which the model reproduces DistServe's measured prefill-only and
# decode-only rates (their 2023 implementation; see docs/benchmarks.md).
DISTSERVE_EFFICIENCY = Efficiency(compute=0.4, memory=0.5)


def ms(millis: float) -> str:
    return "   inf" if millis == float("inf") else f"{millis:6.0f}"


def physics(cfg: InstanceConfig) -> None:
    timing = cfg.build_timing()
    prefill = timing.step_seconds(StepShape(prefill=((PROMPT, 0),), sampled=1))
    one = timing.step_seconds(StepShape(decode_reqs=1, decode_context=PROMPT, sampled=1))
    many = timing.step_seconds(
        StepShape(decode_reqs=32, decode_context=32 * (PROMPT + 32), sampled=32)
    )
    print(
        f"model: {cfg.model.name}, {cfg.model.total_params() / 1e9:.1f} B params, "
        f"{timing.kv_bytes_per_token / 1e6:.2f} MB KV/token; GPU: {cfg.gpu.name}"
    )
    print(
        f"  prefill of {PROMPT} tokens {prefill * 1000:.0f} ms (compute-bound); decode step "
        f"{one * 1000:.1f} ms at batch 1, {many * 1000:.1f} ms at batch 32 (memory-bound); "
        f"KV transfer {timing.kv_transfer_seconds(PROMPT) * 1000:.1f} ms (RDMA)"
    )


def kinds_of(cfg: InstanceConfig) -> dict[str, Cluster]:
    return {
        "colocated": Cluster(colocated=Instances(cfg)),
        "prefill-only": Cluster(prefill=Instances(cfg)),
        "decode-only": Cluster(decode=Instances(cfg)),
    }


def sweep(cfg: InstanceConfig, requests: int) -> None:
    kinds = kinds_of(cfg)
    work = fixed_poisson(PROMPT, OUTPUT, requests=requests)
    rates = [*rate_grid(1.0, 14.0, 14), 16.0, 20.0, 24.0]
    print(
        f"\nP90 TTFT / P90 TPOT (ms) and SLO attainment vs rate ({requests} requests per "
        f"point; TTFT only for prefill-only)"
    )
    print(f"{'rate':>6} | " + " | ".join(f"{k:^26}" for k in kinds))
    for rate in rates:
        row = []
        for kind, cluster in kinds.items():
            s = run_rate(cluster, rate, work, slo=DISTSERVE_SLO)
            tpot = "     -" if kind == "prefill-only" else ms(s.p90_tpot_ms)
            row.append(f"{ms(s.p90_ttft_ms)} {tpot}  {s.attainment:5.0%}  ")
        print(f"{rate:6.1f} | " + " | ".join(f"{r:^26}" for r in row))


def goodputs(cfg: InstanceConfig, requests: int) -> dict[str, float]:
    """Goodput (req/s) of each single-GPU set-up, of 1P2D/2P1D per GPU, and their best."""
    work = fixed_poisson(PROMPT, OUTPUT, requests=requests)
    out = {k: goodput(c, work, slo=DISTSERVE_SLO) for k, c in kinds_of(cfg).items()}
    mixed = Cluster(colocated=Instances(replace(cfg, mixed_chunk=True)))
    out["colocated, mixed chunk"] = goodput(mixed, work, slo=DISTSERVE_SLO)
    for p, d in ((1, 2), (2, 1)):
        cluster = Cluster(prefill=Instances(cfg, p), decode=Instances(cfg, d))
        out[f"{p}P{d}D per GPU"] = goodput(cluster, work, slo=DISTSERVE_SLO) / cluster.gpus
    best = max(("1P2D per GPU", "2P1D per GPU"), key=lambda k: out[k])
    out["best xPyD on 3 GPUs per GPU"] = out[best]
    out["best / colocated"] = out[best] / out["colocated"] if out["colocated"] else float("inf")
    out["best"] = float(best.startswith("2P1D"))
    return out


def compare(cfg: InstanceConfig, requests: int) -> None:
    calibrated = replace(cfg, efficiency=DISTSERVE_EFFICIENCY)
    ours, theirs = goodputs(cfg, requests), goodputs(calibrated, requests)
    eff = DISTSERVE_EFFICIENCY
    print("\ngoodput at 90% attainment of TTFT <= 400 ms and TPOT <= 40 ms (req/s)")
    print(f"  {'':30} {'model':>8} {'model @DistServe-era':>21} {'DistServe Fig. 1':>17}")
    print(f"  {'':30} {'':>8} {f'(compute {eff.compute}, mem {eff.memory})':>21}")
    for key in (
        "colocated",
        "colocated, mixed chunk",
        "prefill-only",
        "decode-only",
        "1P2D per GPU",
        "2P1D per GPU",
        "best / colocated",
    ):
        ref = DISTSERVE.get(key)
        suffix = "x" if key.startswith("best") else ""
        print(
            f"  {key:30} {ours[key]:7.2f}{suffix:1} {theirs[key]:20.2f}{suffix:1} "
            f"{'' if ref is None else ref:>17}"
        )
    print(
        "  best xPyD on 3 GPUs: "
        + ("2P1D" if ours["best"] else "1P2D")
        + f", {ours['best xPyD on 3 GPUs per GPU']:.2f} per GPU vs colocated "
        f"{ours['colocated']:.2f}: {ours['best / colocated']:.2f}x"
    )


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    *,
    api: str,
    prompt: str,
    tokens: int,
    start: asyncio.Event,
) -> list[float]:
    """One stream, as an OpenAI client (`/v1/completions`) or a native client (`/generate`)
    sends it; returns the arrival time of each token."""
    await start.wait()
    times: list[float] = []
    seen = 0
    if api == "openai":
        path = "/v1/completions"
        body: dict[str, object] = {
            "model": "llama",
            "prompt": prompt,
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,
        }
    else:
        path = "/generate"
        body = {
            "text": prompt,
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
    async with session.post(url + path, json=body) as r:
        async for raw in r.content:
            if not raw.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            if api == "openai":
                # The emulated model's tokens are one word each.
                count = seen + json.loads(raw[6:])["choices"][0]["text"].count(" ")
            else:
                # Native chunks are cumulative; read the count without decoding them.
                at = raw.rfind(b'"completion_tokens":') + len(b'"completion_tokens":')
                count = int(raw[at : raw.index(b",", at)])
            times.extend([now] * (count - seen))
            seen = count
    return times


async def _burst(url: str, api: str, streams: int, prompt: str, tokens: int) -> list[list[float]]:
    start = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [
            asyncio.create_task(
                _stream(session, url, api=api, prompt=prompt, tokens=tokens, start=start)
            )
            for _ in range(streams)
        ]
        await asyncio.sleep(0.2)
        start.set()
        return await asyncio.gather(*tasks)


def live(streams: int, tokens: int = 256) -> None:
    model, gpu = "meta-llama/Llama-3.1-8B-Instruct", "H100-SXM"
    print(
        f"\nemulator lag: one real sim worker ({model} on {gpu}, speed 1), {streams} "
        f"concurrent streams of {PROMPT} in / {tokens} out, against the same burst in "
        "virtual time"
    )
    cfg = InstanceConfig(resolve_model(model), gpu_spec(gpu))
    burst = [replace(r, arrival=0.0) for r in poisson_workload(1.0, streams, PROMPT, tokens)]
    modelled = [o.tpot_s for o in Cluster(colocated=Instances(cfg)).run(burst)]
    for api in ("openai", "native"):
        proc = SimProcess(
            worker_argv(port=free_port(), model=model),
            env={"PDKIT_SIM_GPU": gpu, "PDKIT_SIM_LOAD_SECONDS": "0.2"},
        )
        with proc:
            proc.wait_ready()
            prompt = "x" * (PROMPT * 4)  # 4 bytes per token
            results = asyncio.run(_burst(proc.url, api, streams, prompt, tokens))
            info = request_json(proc.url + "/server_info")[1]["sim"]
        observed = [(t[-1] - t[0]) / (len(t) - 1) for t in results if len(t) > 1]
        label = "/v1/completions" if api == "openai" else "/generate"
        print(f"  {label} streams ({len(observed)} complete):")
        for q in (0.5, 0.9):
            o, m = percentile(observed, q), percentile(modelled, q)
            print(
                f"    P{int(q * 100)} TPOT: observed {o * 1000:6.2f} ms, model "
                f"{m * 1000:6.2f} ms, ratio {o / m:5.3f}"
            )
        print(
            f"    step-timer lag: mean {info['step_lag_mean_s'] * 1000:.2f} ms, p99 "
            f"{info['step_lag_p99_s'] * 1000:.2f} ms, max "
            f"{info['step_lag_max_s'] * 1000:.2f} ms over {info['steps']} steps"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800, help="requests per sweep point")
    parser.add_argument("--streams", type=int, default=200, help="concurrent streams (part 2)")
    parser.add_argument("--skip-live", action="store_true", help="skip part 2")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    cfg = InstanceConfig(resolve_model("meta-llama/Llama-2-13b-hf"), gpu_spec("A100-80G"))
    physics(cfg)
    sweep(cfg, args.requests)
    compare(cfg, args.requests)
    print(f"\n(virtual-time part: {time.perf_counter() - t0:.1f} s of wall time)")
    if not args.skip_live:
        live(args.streams)
    return 0


if __name__ == "__main__":
    sys.exit(main())
