"""SGLang 0.5.23's KV events as kit.kvevents encodes them, and the sim's radix cache that
publishes them (no network: a PUB socket bound on loopback is read back in-process)."""

from __future__ import annotations

import hashlib
import json
import random
import time

import msgspec
import zmq

from kit.kvevents import wire
from kit.kvevents.blocks import BlockHasher, block_hashes
from kit.kvevents.publisher import Publisher, offset_endpoint
from kit.sim.prefix_cache import PrefixCache
from tests.conftest import REPO
from tests.support.ports import free_port

# SGLang 0.5.23's own hashes of [5..12] at page size 4 (`mem_cache.utils.get_hash_str` and
# `hash_str_to_int64`, run in .venv-sglang-cpu).
SGLANG_HASHES = [-873556230699706081, -8429985882354289250]


def test_block_hashes_are_sglangs_chained_sha256_of_each_whole_page():
    assert block_hashes(list(range(5, 13)), 4) == SGLANG_HASHES
    assert block_hashes(list(range(5, 15)), 4) == SGLANG_HASHES  # a partial page is not hashed
    assert block_hashes(list(range(5, 13)), 4, limit=1) == SGLANG_HASHES[:1]
    # Chained: the same page after another prefix hashes differently.
    assert block_hashes([9, 10, 11, 12], 4) != SGLANG_HASHES[1:]


def _sha_per_page(ids: list[int], size: int) -> list[int]:
    """The definition, one page at a time: what `block_hashes` must equal."""
    out, prior = [], b""
    for i in range(len(ids) // size):
        page = b"".join(t.to_bytes(4, "little") for t in ids[i * size : (i + 1) * size])
        prior = hashlib.sha256(prior + page).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def test_the_block_hasher_remembers_shared_prefixes_and_gives_the_same_hashes():
    hasher = BlockHasher(chunk_tokens=8)
    assert hasher(list(range(5, 13)), 4) == SGLANG_HASHES
    rng = random.Random(3)
    shared = [rng.randrange(1 << 32) for _ in range(40)]
    for size in (1, 3, 4, 16):
        for tail in (0, 5, 11):
            ids = shared + [rng.randrange(1 << 32) for _ in range(tail)]
            want = _sha_per_page(ids, size)
            assert block_hashes(ids, size) == want
            assert hasher(ids, size) == want
            assert hasher(ids, size, limit=3) == want[:3]
    hits = hasher.hits
    assert hasher([*shared, 1, 2], 1) == _sha_per_page([*shared, 1, 2], 1)
    assert hasher.hits == hits + 5  # the shared 40 tokens: five chunks of 8, none hashed again
    small = BlockHasher(chunk_tokens=8, max_chunks=4)
    assert small(shared, 1) == _sha_per_page(shared, 1)
    assert small.misses == 5 and len(small) == 4  # the oldest chunk went


def test_a_batch_is_the_positional_array_with_tagged_events_and_no_default_fields():
    stored = wire.BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=[7, 8],
        block_size=1,
        lora_id=None,
        medium=wire.GPU,
    )
    batch = wire.KVEventBatch(ts=1.5, events=[stored, wire.AllBlocksCleared()], attn_dp_rank=1)
    raw = msgspec.msgpack.decode(wire.encode_batch(batch))
    assert raw == [
        1.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [1, 2],
                "parent_block_hash": None,
                "token_ids": [7, 8],
                "block_size": 1,
                "lora_id": None,
                "medium": "GPU",
            },
            {"type": "AllBlocksCleared"},
        ],
        1,
    ]
    topic, seq, back = wire.parse(list(wire.frames("kv", 9, batch)))
    assert (topic, seq, back) == ("kv", 9, batch)


def test_each_dp_rank_publishes_on_the_endpoint_port_plus_its_rank():
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"


def _subscriber(port: int) -> zmq.Socket[bytes]:
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVTIMEO, 2000)
    sub.connect(f"tcp://127.0.0.1:{port}")
    return sub


def _until_received(publisher: Publisher, sub: zmq.Socket[bytes], send) -> list[bytes]:
    """Publish (`send`) until the SUB's subscription has landed (ZMQ's slow joiner)."""
    deadline = time.monotonic() + 5
    while True:
        send()
        try:
            return sub.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            assert time.monotonic() < deadline, "no KV event batch arrived"
            time.sleep(0.05)


def test_the_sim_cache_publishes_stores_evictions_and_clears_with_increasing_seq():
    port = free_port()
    publisher = Publisher(f"tcp://*:{port}", "kv", 0)
    sub = _subscriber(port)
    cache = PrefixCache(page_size=4, capacity_pages=3, publisher=publisher)
    try:
        warm = [1, 2, 3, 4]
        message = _until_received(publisher, sub, lambda: cache.insert(warm * 1) or cache.clear())
        assert wire.parse(message)[0] == "kv"
        while sub.poll(300):  # skip the warm-up batches still on their way
            sub.recv_multipart()
        prompt = list(range(100, 110))  # 2 whole pages + 2 tokens
        cache.insert(prompt)
        _, seq, batch = wire.parse(sub.recv_multipart())
        (stored,) = batch.events
        assert isinstance(stored, wire.BlockStored)
        assert stored.block_hashes == block_hashes(prompt, 4)
        assert stored.parent_block_hash is None and stored.token_ids == prompt[:8]
        assert cache.match(prompt) == 8
        assert cache.match(prompt[:8]) == 4  # at most len - 1 tokens: the last page recomputes
        # A longer prompt sharing the prefix stores only its new page, chained to the old.
        longer = [*prompt[:8], 7, 7, 7, 7]
        cache.insert(longer)
        _, seq2, batch = wire.parse(sub.recv_multipart())
        assert seq2 == seq + 1
        (stored,) = batch.events
        assert stored.parent_block_hash == block_hashes(prompt, 4)[-1]
        assert len(cache) == 3
        # Past 3 pages the least recently used leaf goes, in the same batch as the store.
        cache.insert([50, 51, 52, 53])
        _, _, batch = wire.parse(sub.recv_multipart())
        assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockRemoved"]
        assert len(cache) == 3
        cache.clear()
        _, _, batch = wire.parse(sub.recv_multipart())
        assert batch.events == [wire.AllBlocksCleared()]
        assert cache.match(prompt) == 0
    finally:
        sub.close(linger=0)
        cache.close()


def test_a_batch_real_sglang_sent_decodes_and_encodes_back_to_the_same_bytes():
    """tests/oracles/sglang_kv_events.json: one batch SGLang 0.5.23 on CPU published
    (benchmarks/real_kv_events.py), its three frames as they came."""
    oracle = json.loads((REPO / "tests" / "oracles" / "sglang_kv_events.json").read_text())
    frames = [bytes.fromhex(part) for part in oracle["frames_hex"]]
    topic, seq, batch = wire.parse(frames)
    assert topic == "kv" and seq == int.from_bytes(frames[1], "big")
    assert wire.encode_batch(batch) == frames[2]
    (stored,) = batch.events
    assert isinstance(stored, wire.BlockStored) and stored.parent_block_hash is None
    # The hashes it published are the ones kit.kvevents computes from its tokens.
    assert stored.block_hashes == block_hashes(stored.token_ids, stored.block_size)
