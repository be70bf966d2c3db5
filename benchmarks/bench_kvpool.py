"""`make bench-kvpool`: what a KV pool shared by the prefills (Mooncake Store as HiCache's L3)
does to a shared-prefix workload on 2P1D, against the same cluster without it, in one run.

Each configuration is a fresh cluster on this machine (tests/support/kvpool.py): two sim
prefills with HiCache (their own prefix cache; with the pool, its L3 on the real Mooncake
Store master), one sim decode, pdkit's router. The same workload goes to each: `--groups`
groups of prompts of `--input-len` tokens whose first `--prefix-share` is the group's prefix,
`--requests` in all (request i in group i mod groups), Poisson arrivals at `--rate`, streamed;
or (`--workload trace`) a Mooncake-style trace of 512-token hash_ids blocks
(`kit.perf.workload.multi_turn_hash_ids`, as bench-routing's): `--groups` conversations of
`--turns` turns, each turn its history and one more block. The configurations:

    round_robin             prefills taken in turn, no pool: a group's prefix is computed
                            once on each prefill it reaches
    round_robin + pool tcp  the same with the pool: computed once in all, loaded by the other
                            prefill, charged over one 100 Gb/s host NIC (Mooncake over TCP)
    round_robin + pool rdma the same, charged over the prefill's RDMA NIC (the sim's pages
                            cross the real store over TCP either way)
    prefix_affinity         pdkit's default policy, no pool: a group sticks to one prefill

Printed per configuration: TTFT p50/p90, goodput (share within the SLO x rate), the prompt
tokens cached (from the prefill's own cache, from the pool) and computed, from the answers
(SGLang's usage and sglext.cached_tokens_details), and kit.perf's prediction of the cached
and computed tokens (kit/perf/prefix_pool.py, what `pdkit size --prefix-share` uses) with the
measured / predicted ratio, and kit/perf's TTFT p50/p90 (`pred`): the same requests and
arrivals served in virtual time by the instances the sim workers model (their own argv), each
request's cached tokens not computed and its pool tokens loaded over the configuration's link
first (`run_with_prefix_cache`); the configuration's TTFT ratio to the first one is printed
measured and predicted. Ratios between configurations are the result; absolute times are
this machine's (the sim runs the timing model of H100s in real time).

    python -m benchmarks.bench_kvpool [--rate 6] [--requests 183] [--groups 61] [--pool-gb 128]
        [--workload groups|trace] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from kit.aio import run
from kit.bench.client import Client, Target
from kit.bench.metrics import CacheSummary, PointSummary, summarize
from kit.bench.runner import LoadSpec, run_point
from kit.observe.prom import parse_metrics
from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.prefix_pool import (
    PrefixEstimate,
    PrefixWorkload,
    cacheable_prefix,
    estimate,
    pool_load_seconds,
    prefill_seconds_saved,
    run_with_prefix_cache,
    with_prefix_cache,
)
from kit.perf.sweep import Summary
from kit.perf.timing import TimingModel
from kit.perf.workload import (
    TRACE_BLOCK_TOKENS,
    Lengths,
    TraceEntry,
    WorkloadSpec,
    multi_turn_hash_ids,
)
from kit.sim.args import parse_args
from kit.topology.launch import Parallelism
from kit.topology.schema import SLO
from tests.support.kvpool import PoolCluster
from tests.support.sim_launch import SimProcess

MODEL = "llama"
MODEL_PATH = "meta-llama/Llama-3.1-8B-Instruct"
PAGE = 16
ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1"}


@dataclass
class Outcome:
    name: str
    summary: PointSummary
    cache: CacheSummary
    predicted: PrefixEstimate
    model: Summary
    """kit/perf's run of the same requests with their cached tokens (TTFT, attainment)."""
    computed_metric: float
    pool_objects: float | None


def _metric_total(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        return parse_metrics(answer.read().decode()).total(name) or 0.0


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    if args.workload == "trace":
        return WorkloadSpec(count=args.requests, seed=args.seed, trace=tuple(_trace(args)))
    return WorkloadSpec(
        input=Lengths.fixed(args.input_len),
        output=Lengths.fixed(args.output_len),
        count=args.requests,
        seed=args.seed,
    )


def _trace(args: argparse.Namespace) -> list[TraceEntry]:
    """`--workload trace`: `--groups` multi-turn conversations of `--turns` turns
    (`multi_turn_hash_ids`, as bench-routing's trace), Poisson arrivals at `--rate`."""
    rng = random.Random(f"{args.seed}:trace")
    at = 0.0
    entries = []
    for blocks in multi_turn_hash_ids(args.groups, args.turns, args.seed):
        at += rng.expovariate(args.rate)
        entries.append(TraceEntry(at, len(blocks) * TRACE_BLOCK_TOKENS, args.output_len, blocks))
    return entries


def _instance(worker: SimProcess) -> InstanceConfig:
    """The instance a sim worker models itself as (its own argv's launch record)."""
    return InstanceConfig.from_launch(parse_args(worker.argv).launch(None))


async def _point(url: str, args: argparse.Namespace, slo: SLO) -> PointSummary:
    spec = _spec(args)
    load = LoadSpec(
        stream=True,
        timeout_s=120,
        prefix_share=args.prefix_share,
        prefix_groups=args.groups,
        cache_details=True,
    )
    async with Client(Target(url, MODEL), 120) as client:
        point = await run_point(client, spec, args.rate, load, run_id="kvpool")
    return summarize(point, slo)


def configuration(name: str, args: argparse.Namespace, slo: SLO) -> Outcome:
    pool = "pool" in name
    protocol = "rdma" if name.endswith("rdma") else "tcp"
    policy = "prefix_affinity" if name.startswith("prefix_affinity") else "round_robin"
    lb_args = ("--health-interval", "0.05", "--prefill-policy", policy)
    print(f"{name}: starting 2 prefills, 1 decode, router{' and the pool' if pool else ''}")
    segment = int(args.pool_gb * (1 << 30))
    with PoolCluster(
        prefills=2, pool=pool, segment_bytes=segment, protocol=protocol, env=ENV, lb_args=lb_args
    ) as cluster:
        summary = run(_point(cluster.url, args, slo))
        computed = sum(
            _metric_total(p.url, "sglang:prompt_tokens_total")
            - _metric_total(p.url, "sglang:cached_tokens_total")
            for p in cluster.prefills
        )
        objects = (
            parse_metrics(cluster.master.metrics()).total("master_key_count")
            if cluster.master
            else None
        )
        model = Cluster(
            prefill=Instances(_instance(cluster.prefills[0]), len(cluster.prefills)),
            decode=Instances(_instance(cluster.decode)),
            rdma=False,  # the sim's PD transfers: mooncake_tcp
            pool_rdma=protocol == "rdma",
        )
    assert summary.cache is not None, "the answers reported no cached tokens"
    sticky = policy == "prefix_affinity"
    requests = _spec(args).requests(args.rate)
    if args.workload == "trace":
        # Blocks: the replay's own totals (a trace's prompts carry their lengths).
        replayed = with_prefix_cache(
            requests,
            prefix_share=0,
            groups=0,
            prefills=2,
            page_size=PAGE,
            pool=pool,
            sticky=sticky,
        )
        predicted = PrefixEstimate(
            prompt_tokens=sum(r.prompt_len for r in requests),
            device_tokens=sum(r.cached_tokens - r.pool_tokens for r in replayed),
            storage_tokens=sum(r.pool_tokens for r in replayed),
            pool_loads=sum(1 for r in replayed if r.pool_tokens),
            prefix_tokens=0,
        )
    else:
        prompt_len = prompt_tokens(summary)
        workload = PrefixWorkload(args.requests, prompt_len, args.prefix_share, args.groups)
        predicted = estimate(workload, prefills=1 if sticky else 2, page_size=PAGE, pool=pool)
        requests = [replace(r, prompt_len=prompt_len) for r in requests]
    modelled = run_with_prefix_cache(
        model,
        requests,
        args.rate,
        slo,
        prefix_share=args.prefix_share,
        groups=args.groups,
        page_size=PAGE,
        pool=pool,
        sticky=sticky,
    )
    return Outcome(name, summary, summary.cache, predicted, modelled, computed, objects)


def prompt_tokens(summary: PointSummary) -> int:
    """Tokens per prompt as the server counted them (the chat template adds a few)."""
    assert summary.cache is not None
    return round(summary.cache.prompt_tokens / summary.ok)


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.2f}" if predicted else "-"


def report(outcomes: list[Outcome], args: argparse.Namespace) -> str:
    base = outcomes[0]
    lines = [
        f"workload: {args.requests} requests at {args.rate:g} req/s, {_shape(args)}, "
        f"{args.output_len} out; "
        f"2 prefills + 1 decode (sim, H100 timing), SLO TTFT <= {args.ttft_ms:g} ms",
        "",
        f"{'configuration':<24} {'TTFT p50':>9} {'pred':>7} {'ratio':>6} {'p90':>7} "
        f"{'pred':>7} {'goodput':>8} {'cached':>7} {'pool':>6} {'computed':>9} "
        f"{'predicted':>10} {'ratio':>6}",
    ]
    for o in outcomes:
        s, c = o.summary, o.cache
        pool = f"{(c.storage_tokens or 0) / c.prompt_tokens:.0%}"
        predicted = o.predicted.computed_tokens
        p50, m = s.ttft_ms.p50 or 0, o.model
        lines.append(
            f"{o.name:<24} {p50:>7.0f}ms {m.p50_ttft_ms:>5.0f}ms {_ratio(p50, m.p50_ttft_ms):>6} "
            f"{s.ttft_ms.p90 or 0:>5.0f}ms {m.p90_ttft_ms:>5.0f}ms "
            f"{s.goodput:>6.2f}/s {c.hit_rate:>7.0%} {pool:>6} {c.computed_tokens:>9} "
            f"{predicted:>10.0f} {_ratio(c.computed_tokens, predicted):>6}"
        )
    lines += [
        "",
        _hit_costs(args) if args.workload == "groups" else "(trace: no single prefix)",
        "",
    ]
    for o in outcomes[1:]:
        s, b = o.summary, base.summary
        measured = (s.ttft_ms.p50 or 0) / (b.ttft_ms.p50 or 1)
        modelled = o.model.p50_ttft_ms / base.model.p50_ttft_ms
        lines.append(
            f"{o.name} vs {base.name}: "
            f"TTFT p50 x{measured:.2f} (predicted x{modelled:.2f}, measured/predicted "
            f"{measured / modelled:.2f}), "
            f"p90 x{(s.ttft_ms.p90 or 0) / (b.ttft_ms.p90 or 1):.2f}, prefill tokens "
            f"computed x{o.cache.computed_tokens / max(base.cache.computed_tokens, 1):.2f}, "
            f"goodput {s.goodput:.2f} vs {base.summary.goodput:.2f} req/s"
        )
    for o in outcomes:
        extra = f", the pool holds {o.pool_objects:.0f} pages" if o.pool_objects is not None else ""
        lines.append(
            f"{o.name}: prefills' metrics say {o.computed_metric:.0f} prompt tokens computed "
            f"(answers: {o.cache.computed_tokens}); pool hits in {o.cache.pool_hit_requests} "
            f"requests{extra}; predicted hit rate {o.predicted.hit_rate:.1%} "
            f"(measured {o.cache.hit_rate:.1%})"
        )
    return "\n".join(lines)


def _shape(args: argparse.Namespace) -> str:
    if args.workload == "trace":
        return (
            f"trace: {args.groups} conversations x {args.turns} turns of "
            f"{TRACE_BLOCK_TOKENS}-token hash_ids blocks (system prompt of 4 shared by pairs, "
            "each turn its history and one more)"
        )
    return f"{args.input_len} tokens in ({args.prefix_share:.0%} shared in {args.groups} groups)"


def _hit_costs(args: argparse.Namespace) -> str:
    """What kit/perf says one prefix hit is worth on the sim's instances (H100, tp 1)."""
    timing = TimingModel(resolve_model(MODEL_PATH), gpu_spec("H100-SXM"), Parallelism())
    prefix = cacheable_prefix(args.input_len, args.prefix_share, PAGE)
    saved = prefill_seconds_saved(timing, args.input_len, prefix) * 1000
    tcp, rdma = (pool_load_seconds(timing, prefix, rdma) * 1000 for rdma in (False, True))
    return (
        f"kit/perf: a {prefix}-token prefix hit saves {saved:.0f} ms of prefill; loading it from "
        f"the pool costs {tcp:.0f} ms over TCP, {rdma:.0f} ms over RDMA"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--requests", type=int, default=183)
    parser.add_argument("--groups", type=int, default=61)
    parser.add_argument("--input-len", type=int, default=8192)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--prefix-share", type=float, default=0.9)
    parser.add_argument("--ttft-ms", type=float, default=400.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pool-gb", type=float, default=128.0, help="DRAM each prefill gives the pool (GiB)."
    )
    parser.add_argument(
        "--workload",
        choices=("groups", "trace"),
        default="groups",
        help="groups: shared-prefix groups; trace: multi-turn hash_ids blocks (--groups "
        "conversations of --turns turns; --requests is groups x turns)",
    )
    parser.add_argument("--turns", type=int, default=6, help="--workload trace: turns each")
    parser.add_argument("--json", type=Path, help="Write the summaries here.")
    args = parser.parse_args(argv)
    if args.workload == "trace":
        args.requests = args.groups * args.turns
    slo = SLO(ttft_ms=args.ttft_ms, tpot_ms=200.0)
    names = ("round_robin", "round_robin + pool tcp", "round_robin + pool rdma", "prefix_affinity")
    outcomes = [configuration(name, args, slo) for name in names]
    print(report(outcomes, args))
    if args.json:
        data = {o.name: o.summary.to_json() for o in outcomes}
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
