"""What prefix caching, and a KV pool shared by the prefills (HiCache L3), does to a workload
whose prompts share prefixes: the share of prompt tokens taken from a cache, from where, the
prefill compute that saves and the transfer the pool's pages cost. Pure arithmetic.

The workload: `requests` prompts of `prompt_len` tokens in `groups` groups; the first
`prefix_share` of each prompt is its group's prefix, the rest its own. Requests go to
`prefills` instances in turn (round robin: a group's requests visit every prefill). Only whole
pages are cached, and the page holding a prompt's last token is always computed (SGLang).

- Request i is in group i mod groups and goes to prefill i mod prefills, so a group reaches
  prefills / gcd(groups, prefills) of them (with as many groups as prefills, or a multiple,
  each group stays on one).
- Without a pool, a prefill computes a group's prefix the first time that group reaches it:
  min(n, prefills reached) misses per group of n requests; later ones hit its own cache.
- With the pool, only the group's first request anywhere computes it; every other prefill
  loads it from the pool the first time (a pool hit), then has it locally.
- Capacity: when the distinct prefixes (groups x prefix pages) exceed what a cache holds, an
  LRU over a round-robin stream keeps about capacity / demand of them (the share of hits kept
  is that ratio, at most 1).

`with_prefix_cache` replays the same rules request by request (unbounded caches), giving
each `Request` the tokens it takes from a cache and loads from the pool, so that a
virtual-time `Cluster` charges the prefill only the rest, after the pool's load over its link:
the TTFT and goodput the pool gives, not only the tokens it saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kit.perf.cluster import Cluster
from kit.perf.sweep import Summary, summarize
from kit.perf.timing import StepShape, TimingModel
from kit.perf.workload import TRACE_BLOCK_TOKENS, Request
from kit.topology.schema import SLO


@dataclass(frozen=True)
class PrefixWorkload:
    requests: int
    prompt_len: int
    prefix_share: float
    groups: int


@dataclass(frozen=True)
class PrefixEstimate:
    """Prompt tokens of the whole workload by where they come from."""

    prompt_tokens: int
    device_tokens: float
    storage_tokens: float
    pool_loads: float
    """Requests that load their prefix from the pool."""
    prefix_tokens: int
    """Cacheable tokens of one prompt's prefix (whole pages)."""

    @property
    def cached_tokens(self) -> float:
        return self.device_tokens + self.storage_tokens

    @property
    def computed_tokens(self) -> float:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def pool_hit_rate(self) -> float:
        return self.storage_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def cacheable_prefix(prompt_len: int, prefix_share: float, page_size: int) -> int:
    """Tokens of a prompt's shared prefix that a cache can hold: whole pages, never the page
    with the prompt's last token."""
    prefix = min(round(prompt_len * prefix_share), prompt_len - 1)
    return max(prefix, 0) // page_size * page_size


def estimate(
    workload: PrefixWorkload,
    *,
    prefills: int,
    page_size: int,
    pool: bool,
    local_capacity_tokens: float = float("inf"),
    pool_capacity_tokens: float = float("inf"),
) -> PrefixEstimate:
    """Where the workload's prompt tokens come from (see the module doc)."""
    prefix = cacheable_prefix(workload.prompt_len, workload.prefix_share, page_size)
    total = workload.requests * workload.prompt_len
    if prefix == 0 or workload.groups < 1 or workload.requests == 0:
        return PrefixEstimate(total, 0.0, 0.0, 0.0, prefix)
    per_group = workload.requests / workload.groups
    demand = workload.groups * prefix
    keep_local = min(1.0, local_capacity_tokens / demand)
    keep_pool = min(1.0, pool_capacity_tokens / demand)
    reached = prefills // math.gcd(workload.groups, prefills)
    first_visits = min(per_group, reached)  # requests that reach a prefill new to the group
    later = per_group - first_visits
    device = later * keep_local
    storage = (first_visits - 1) * keep_pool if pool else 0.0
    # Hits a small local cache lost go to the pool when there is one.
    if pool:
        storage += later * (1 - keep_local) * keep_pool
    groups = workload.groups
    return PrefixEstimate(
        prompt_tokens=total,
        device_tokens=device * prefix * groups,
        storage_tokens=storage * prefix * groups,
        pool_loads=storage * groups,
        prefix_tokens=prefix,
    )


def prefill_seconds_saved(timing: TimingModel, prompt_len: int, cached: int) -> float:
    """Prefill compute one request saves when `cached` of its `prompt_len` tokens come from a
    cache (s): the whole prompt's forward step less the rest's over the cached context."""
    whole = timing.step_seconds(StepShape(prefill=((prompt_len, 0),), sampled=1))
    rest = timing.step_seconds(StepShape(prefill=((prompt_len - cached, cached),), sampled=1))
    return whole - rest


def pool_load_seconds(timing: TimingModel, tokens: int, rdma: bool) -> float:
    """Time to load `tokens` tokens of KV from the pool over its link (s): the same bytes and
    link as a PD transfer (`TimingModel.kv_transfer_seconds`)."""
    return timing.kv_transfer_seconds(tokens, rdma=rdma)


def with_prefix_cache(
    requests: Sequence[Request],
    *,
    prefix_share: float,
    groups: int,
    prefills: int,
    page_size: int,
    pool: bool,
    sticky: bool = False,
) -> list[Request]:
    """`requests` (in arrival order) with the prompt tokens each takes from a cache. Request i
    goes to prefill i mod `prefills`; its prefix is its group's (i mod `groups`, the first
    `prefix_share` of the prompt), or, for a trace's request, its leading `hash_ids` blocks
    (`TRACE_BLOCK_TOKENS` each). `sticky`: every request of a group (of a first block) to one
    prefill, as prefix affinity keeps them. What a prefill computed or loaded is in its own
    cache; past that, with the pool, what any prefill computed is loaded from the pool
    (`pool_tokens`); the rest is computed. Only whole pages short of the prompt's last token
    are cached (unbounded caches)."""
    if prefills < 1 or (groups < 1 and not any(r.hash_ids for r in requests)):
        return list(requests)
    local: list[set[tuple[int, ...]]] = [set() for _ in range(prefills)]
    stored: set[tuple[int, ...]] = set()
    out = []
    for i, req in enumerate(requests):
        if req.hash_ids:
            # A block is cached with the blocks before it (a radix cache's path).
            chain = [req.hash_ids[: k + 1] for k in range(len(req.hash_ids))]
            size = TRACE_BLOCK_TOKENS
            # Sticky: a prompt stays with the prefill of its first block (any fixed choice
            # caches the same; prefix affinity hashes the prompt's start).
            where = local[req.hash_ids[0] % prefills if sticky else i % prefills]
        else:
            group = i % groups
            chain = [(group,)] if cacheable_prefix(req.prompt_len, prefix_share, page_size) else []
            size = cacheable_prefix(req.prompt_len, prefix_share, page_size)
            where = local[group % prefills if sticky else i % prefills]
        held = next((k for k, key in enumerate(chain) if key not in where), len(chain))
        loaded = held
        if pool:
            loaded = next(
                (k for k in range(held, len(chain)) if chain[k] not in stored), len(chain)
            )
        limit = (req.prompt_len - 1) // page_size * page_size
        cached = min(loaded * size, limit)
        from_pool = cached - min(held * size, limit)
        out.append(replace(req, cached_tokens=cached, pool_tokens=from_pool))
        where.update(chain)
        if pool:
            stored.update(chain)
    return out


def run_with_prefix_cache(
    cluster: Cluster,
    requests: Sequence[Request],
    rate: float,
    slo: SLO,
    *,
    prefix_share: float,
    groups: int,
    page_size: int,
    pool: bool,
    sticky: bool = False,
) -> Summary:
    """Serve `requests` (offered at `rate`) on the PD `cluster` with prefix caching as
    `with_prefix_cache` assigns it (the cluster's prefills, taken in turn): TTFT and TPOT
    percentiles and SLO attainment, the cached tokens not computed and the pool's loads
    charged over `cluster.pool_rdma`'s link."""
    if cluster.prefill is None or cluster.decode is None:
        raise ValueError("run_with_prefix_cache models a PD cluster (prefill and decode)")
    cached = with_prefix_cache(
        requests,
        prefix_share=prefix_share,
        groups=groups,
        prefills=cluster.prefill.count * cluster.prefill.config.dp,
        page_size=page_size,
        pool=pool,
        sticky=sticky,
    )
    return summarize(cluster.kind, rate, cluster.run(cached), slo)
