"""`pdkit size --prefix-share S --prefix-groups G`: what prefix caching, and a KV pool shared
by the prefills (topology `kv_pool:`), would do for the chosen deployment's workload: the share
of prompt tokens cached (from each prefill's own cache, from the pool), the prefill tokens left
to compute, the prefill time one hit saves and the time its pool load costs, and the TTFT
p50/p90 and SLO attainment at the deployment's sized goodput without and with the pool: the
workload's requests served in virtual time with each one's cached tokens not computed and its
pool tokens loaded over the pool's link first (kit/perf/prefix_pool.py; requests taken to the
prefills in turn, as `make bench-kvpool` sends them, which prints this prediction beside what
it measures).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kit.perf.prefix_pool import (
    PrefixEstimate,
    PrefixWorkload,
    estimate,
    pool_load_seconds,
    prefill_seconds_saved,
    run_with_prefix_cache,
)
from kit.perf.timing import TimingModel
from kit.sizing.problem import SizingProblem
from kit.sizing.search import Rated

DEFAULT_PAGE_SIZE = 64
"""The page size `kv_pool:` renders by default (its `page_size`)."""


def _page_size(problem: SizingProblem) -> int:
    pool = problem.base.get("kv_pool")
    if isinstance(pool, dict) and pool.get("page_size"):
        return int(pool["page_size"])
    args = problem.base.get("defaults", {}).get("args", {})
    return int(args.get("page-size") or args.get("page_size") or DEFAULT_PAGE_SIZE)


def _rdma(problem: SizingProblem) -> bool:
    pool = problem.base.get("kv_pool")
    protocol = pool.get("protocol", "rdma") if isinstance(pool, dict) else "rdma"
    return bool(protocol == "rdma")


def prefix_report(
    problem: SizingProblem, chosen: Rated, share: float, groups: int
) -> dict[str, Any] | None:
    """The estimate for `chosen` (a PD deployment) without and with the pool; None when it has
    no prefills or the workload shares nothing."""
    prefill = chosen.deployment.prefill
    if prefill is None or share <= 0 or groups < 1:
        return None
    spec = problem.workload
    prompt_len = round(spec.input.mean)
    workload = PrefixWorkload(spec.count, prompt_len, share, groups)
    page = _page_size(problem)
    timing = TimingModel(problem.model, problem.gpu, prefill.option.parallelism)
    out: dict[str, Any] = {"prefills": prefill.count, "page_size": page, "prompt_len": prompt_len}
    for name, pool in (("without_pool", False), ("with_pool", True)):
        e: PrefixEstimate = estimate(workload, prefills=prefill.count, page_size=page, pool=pool)
        out[name] = {
            "hit_rate": round(e.hit_rate, 4),
            "pool_hit_rate": round(e.pool_hit_rate, 4),
            "computed_tokens_per_request": round(e.computed_tokens / workload.requests, 1),
        }
    # TTFT at the deployment's sized goodput (model time, then wall at the sim's speed).
    rate = chosen.goodput / problem.speed
    cluster = replace(chosen.deployment.cluster(problem), pool_rdma=_rdma(problem))
    requests = spec.requests(rate)
    for name, pool in (("without_pool", False), ("with_pool", True)):
        run = run_with_prefix_cache(
            cluster,
            requests,
            rate,
            problem.model_slo,
            prefix_share=share,
            groups=groups,
            page_size=page,
            pool=pool,
        )
        out[name] |= {
            # The model runs at full speed under the SLO scaled by s: wall = model / s.
            "ttft_p50_ms": round(run.p50_ttft_ms / problem.speed, 1),
            "ttft_p90_ms": round(run.p90_ttft_ms / problem.speed, 1),
            "attainment": round(run.attainment, 4),
        }
    out["rate"] = round(chosen.goodput, 3)
    prefix = estimate(workload, prefills=prefill.count, page_size=page, pool=True).prefix_tokens
    out["prefix_tokens"] = prefix
    out["prefill_ms_saved_per_hit"] = round(
        prefill_seconds_saved(timing, prompt_len, prefix) * 1000, 2
    )
    out["pool_load_ms_per_hit"] = round(pool_load_seconds(timing, prefix, _rdma(problem)) * 1000, 2)
    return out


def prefix_lines(report: dict[str, Any]) -> list[str]:
    """The estimate as `pdkit size` prints it."""
    lines = [
        f"prefix caching ({report['prefills']} prefill(s) taken in turn, "
        f"{report['prompt_len']}-token prompts, {report['prefix_tokens']} cacheable prefix "
        f"tokens, page {report['page_size']}):"
    ]
    for name, label in (("without_pool", "own cache only"), ("with_pool", "with a KV pool")):
        r = report[name]
        lines.append(
            f"  {label}: {r['hit_rate']:.0%} of prompt tokens cached "
            f"({r['pool_hit_rate']:.0%} from the pool), "
            f"{r['computed_tokens_per_request']:.0f} computed per request"
        )
    lines.append(
        f"  a prefix hit saves {report['prefill_ms_saved_per_hit']:.1f} ms of prefill; loading it "
        f"from the pool costs {report['pool_load_ms_per_hit']:.1f} ms"
    )
    alone, pooled = report["without_pool"], report["with_pool"]
    ratio = pooled["ttft_p50_ms"] / alone["ttft_p50_ms"] if alone["ttft_p50_ms"] else 0.0
    lines.append(
        f"  at {report['rate']:g} req/s: TTFT p50 {alone['ttft_p50_ms']:.0f} ms (p90 "
        f"{alone['ttft_p90_ms']:.0f}, {alone['attainment']:.0%} within the SLO) own cache only, "
        f"{pooled['ttft_p50_ms']:.0f} ms (p90 {pooled['ttft_p90_ms']:.0f}, "
        f"{pooled['attainment']:.0%}) with the pool: x{ratio:.2f}"
    )
    return lines
