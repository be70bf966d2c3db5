"""How a request's KV bytes map onto pages and Mooncake writes."""

from __future__ import annotations

import pytest

from kit.perf.kv_pages import KvPages, page_runs
from kit.sim.transfer import (
    MAX_BUFFER_BYTES,
    TransferError,
    extents,
    pair_extents,
    room_bytes,
    scaled_bytes_per_token,
)


def test_pool_hands_out_contiguous_pages_first():
    pool = KvPages(10, 16)
    assert pool.alloc(3) == [0, 1, 2]
    assert pool.alloc(20) is None and pool.free_pages == 7
    assert page_runs([0, 1, 2, 7, 8, 4]) == [(0, 3), (7, 2), (4, 1)]


def test_freed_blocks_come_back_as_contiguous_runs():
    pool = KvPages(100, 1)
    first, second = pool.alloc(30), pool.alloc(30)
    pool.free(first)
    pool.free(second)
    again = pool.alloc(60)
    assert len(page_runs(again)) <= 2  # not 60 single pages


def test_a_pool_of_millions_of_pages_costs_what_it_hands_out():
    pool = KvPages(50_000_000, 1)  # an EP instance's rank; a listed free list took GBs
    first = pool.alloc(3)
    assert first == [0, 1, 2] and pool.free_pages == 50_000_000 - 3
    pool.free(first)
    assert pool.alloc(5) == [0, 1, 2, 3, 4]  # the freed run first, then pages never used
    assert pool.alloc(50_000_000) is None and pool.used_pages == 5


def test_extents_cover_exactly_the_request_bytes():
    ext = extents(1000, 64, [0, 1, 5], 150)
    assert ext == [(1000, 128), (1000 + 5 * 64, 22)]
    with pytest.raises(TransferError):
        extents(0, 64, [0], 100)


def test_pairing_splits_at_every_boundary():
    writes = pair_extents([(0, 100), (500, 50)], [(1000, 60), (2000, 90)])
    assert writes == [(0, 1000, 60), (60, 2000, 40), (500, 2040, 50)]
    assert sum(n for *_, n in writes) == 150


def test_scaled_bytes_per_token():
    assert scaled_bytes_per_token(131072, 1024, 10_000) == 128
    assert scaled_bytes_per_token(100, 1024, 10) == 1
    assert scaled_bytes_per_token(131072, 1, 10**6) * 10**6 <= MAX_BUFFER_BYTES


def test_room_bytes_are_deterministic():
    assert room_bytes(7, 64) == room_bytes(7, 64) != room_bytes(8, 64)
