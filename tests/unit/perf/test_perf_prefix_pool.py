"""kit.perf.prefix_pool: where a shared-prefix workload's prompt tokens come from, with and
without a KV pool shared by the prefills."""

from __future__ import annotations

import pytest

from kit.perf.prefix_pool import PrefixWorkload, cacheable_prefix, estimate

# 61 groups of 3 requests: round robin over 2 prefills sends a group to both.
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
