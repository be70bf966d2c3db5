"""kit.perf.prefix_pool: where a shared-prefix workload's prompt tokens come from, with and
without a KV pool shared by the prefills."""

from __future__ import annotations

import pytest

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.prefix_pool import (
    PrefixWorkload,
    cacheable_prefix,
    estimate,
    pool_load_seconds,
    prefill_seconds_saved,
    run_with_prefix_cache,
    with_prefix_cache,
)
from kit.perf.timing import TimingModel
from kit.perf.workload import Lengths, Request, WorkloadSpec, multi_turn_hash_ids
from kit.topology.launch import Parallelism
from kit.topology.schema import SLO

# 61 groups of 3 requests: round robin over 2 prefills sends a group to both.
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORKLOAD = PrefixWorkload(requests=183, prompt_len=8192, prefix_share=0.9, groups=61)


def test_only_whole_pages_short_of_the_last_token_are_cacheable():
    assert cacheable_prefix(8192, 0.9, 16) == 7360
    assert cacheable_prefix(100, 1.0, 16) == 96  # the page with the last token is computed
    assert cacheable_prefix(10, 0.5, 16) == 0


def test_the_pool_turns_a_second_prefills_miss_into_a_pool_hit():
    alone = estimate(WORKLOAD, prefills=2, page_size=16, pool=False)
    pooled = estimate(WORKLOAD, prefills=2, page_size=16, pool=True)
    # Without it each group's prefix is computed on both prefills: 1 hit in 3 requests.
    assert alone.device_tokens == pytest.approx(61 * 7360)
    assert alone.storage_tokens == 0
    # With it only once: the other prefill loads it from the pool.
    assert pooled.storage_tokens == pytest.approx(61 * 7360)
    assert pooled.device_tokens == alone.device_tokens
    assert pooled.pool_loads == pytest.approx(61)
    assert pooled.computed_tokens == pytest.approx(alone.computed_tokens - 61 * 7360)
    assert pooled.hit_rate == pytest.approx(2 * 61 * 7360 / (183 * 8192))


def test_one_prefill_per_group_needs_no_pool_and_small_caches_lose_hits():
    sticky = estimate(WORKLOAD, prefills=1, page_size=16, pool=False)
    assert sticky.device_tokens == pytest.approx(2 * 61 * 7360)
    half = estimate(
        WORKLOAD, prefills=2, page_size=16, pool=True, pool_capacity_tokens=61 * 7360 / 2
    )
    assert half.storage_tokens == pytest.approx(61 * 7360 / 2)


def _cluster(pool_rdma: bool) -> Cluster:
    config = InstanceConfig(model=resolve_model(MODEL), gpu=gpu_spec("H100-SXM"), page_size=16)
    return Cluster(
        prefill=Instances(config, 2), decode=Instances(config), rdma=False, pool_rdma=pool_rdma
    )


def test_requests_in_turn_get_their_prefix_from_their_own_cache_or_the_pool():
    requests = [Request(float(i), 8192, 16) for i in range(7)]
    kwargs = {"prefix_share": 0.9, "groups": 3, "prefills": 2, "page_size": 16}
    alone = with_prefix_cache(requests, pool=False, **kwargs)
    pooled = with_prefix_cache(requests, pool=True, **kwargs)
    # Request i: group i mod 3 on prefill i mod 2. Requests 3-5 reach the prefill the group
    # has not visited: recomputed without the pool, loaded from it with one; request 6 is back.
    assert [r.cached_tokens for r in alone] == [0, 0, 0, 0, 0, 0, 7360]
    assert [r.cached_tokens for r in pooled] == [0, 0, 0, 7360, 7360, 7360, 7360]
    assert [r.pool_tokens for r in pooled] == [0, 0, 0, 7360, 7360, 7360, 0]
    sticky = with_prefix_cache(requests, pool=False, sticky=True, **kwargs)
    assert [r.cached_tokens for r in sticky] == [0, 0, 0, 7360, 7360, 7360, 7360]


def test_the_cluster_skips_cached_tokens_and_charges_the_pools_load_over_its_link():
    # One request at a time (10 s apart): TTFT differences are the prefill saved, the load.
    timing = TimingModel(resolve_model(MODEL), gpu_spec("H100-SXM"), Parallelism())
    computed, local, tcp = (
        Request(0.0, 8192, 16),
        Request(10.0, 8192, 16, cached_tokens=7360),
        Request(20.0, 8192, 16, cached_tokens=7360, pool_tokens=7360),
    )
    for rdma in (False, True):
        outcomes = _cluster(rdma).run([computed, local, tcp])
        whole, hit, loaded = (o.ttft_s for o in outcomes)
        assert whole - hit == pytest.approx(prefill_seconds_saved(timing, 8192, 7360), rel=0.05)
        assert loaded - hit == pytest.approx(pool_load_seconds(timing, 7360, rdma), rel=0.01)


def test_the_pool_cuts_the_modelled_ttft_of_a_shared_prefix_workload_rdma_more_than_tcp():
    spec = WorkloadSpec(input=Lengths.fixed(8192), output=Lengths.fixed(16), count=183)
    requests = spec.requests(6.0)
    slo = SLO(ttft_ms=400, tpot_ms=200)

    def p50(pool: bool, rdma: bool = False, sticky: bool = False) -> float:
        run = run_with_prefix_cache(_cluster(rdma), requests, 6.0, slo, prefix_share=0.9,
                                    groups=61, page_size=16, pool=pool, sticky=sticky)  # fmt: skip
        return run.p50_ttft_ms

    alone, tcp, rdma = p50(False), p50(True), p50(True, rdma=True)
    assert rdma < tcp < alone
    assert p50(False, sticky=True) < alone  # affinity: a group's prefix stays on one prefill


def test_groups_that_round_robin_keeps_on_one_prefill_gain_nothing_from_the_pool():
    # 40 groups over 2 prefills: request i (group i mod 40) always meets the same prefill.
    even = PrefixWorkload(requests=120, prompt_len=4096, prefix_share=0.9, groups=40)
    pooled = estimate(even, prefills=2, page_size=16, pool=True)
    assert pooled.storage_tokens == 0
    assert pooled.device_tokens == pytest.approx(40 * 2 * 3680)
    requests = [Request(float(i), 4096, 16) for i in range(120)]
    replayed = with_prefix_cache(
        requests, prefix_share=0.9, groups=40, prefills=2, page_size=16, pool=True
    )
    assert sum(r.pool_tokens for r in replayed) == 0
    assert sum(r.cached_tokens for r in replayed) == pooled.cached_tokens


def test_a_traces_blocks_come_from_the_own_cache_then_the_pool_block_by_block():
    requests = [
        Request(0.0, 1024, 8, hash_ids=(1, 2)),
        Request(1.0, 1536, 8, hash_ids=(1, 2, 3)),
        Request(2.0, 2048, 8, hash_ids=(1, 2, 3, 4)),
    ]
    kwargs = {"prefix_share": 0.0, "groups": 0, "prefills": 2, "page_size": 16}
    pooled = with_prefix_cache(requests, pool=True, **kwargs)
    # Request 1 (prefill-1) loads blocks 1-2 from the pool; request 2 (prefill-0) has them
    # itself and loads block 3, which prefill-1 computed.
    assert [(r.cached_tokens, r.pool_tokens) for r in pooled] == [(0, 0), (1024, 1024), (1536, 512)]
    alone = with_prefix_cache(requests, pool=False, **kwargs)
    assert [(r.cached_tokens, r.pool_tokens) for r in alone] == [(0, 0), (0, 0), (1024, 0)]
    # The page holding the last token is computed even when every block is held.
    again = with_prefix_cache([requests[0], requests[0]], pool=False, **{**kwargs, "prefills": 1})
    assert again[1].cached_tokens == 1008


def test_a_multi_turn_trace_repeats_each_conversations_history_and_adds_a_block():
    trace = multi_turn_hash_ids(4, 3, seed=1)
    assert len(trace) == 12 and multi_turn_hash_ids(4, 3, seed=1) == trace
    by_system: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for blocks in trace:
        by_system.setdefault(blocks[:4], []).append(blocks)
    assert len(by_system) == 2  # conversations share a system prompt by pairs
    lengths = sorted(len(b) for b in trace)
    assert lengths == [5] * 4 + [6] * 4 + [7] * 4
    for blocks in trace:
        if len(blocks) > 5:
            assert blocks[:-1] in trace  # the previous turn is this one's history


def test_sticky_trace_prompts_stay_with_the_prefill_of_their_first_block():
    requests = [Request(float(i), 1536, 8, hash_ids=(7, 8, 100 + i)) for i in range(4)]
    kwargs = {"prefix_share": 0.0, "groups": 0, "prefills": 2, "page_size": 16, "pool": False}
    sticky = with_prefix_cache(requests, sticky=True, **kwargs)
    assert [r.cached_tokens for r in sticky] == [0, 1024, 1024, 1024]
    in_turn = with_prefix_cache(requests, **kwargs)
    assert [r.cached_tokens for r in in_turn] == [0, 0, 1024, 1024]
