"""cache_aware's KV-event index and choice (no network): what a prefill has cached, and the
rules that keep the router from ever routing on entries a worker may no longer hold."""

from __future__ import annotations

import json
import random

from kit.kvevents import wire
from kit.kvevents.blocks import block_hashes
from kit.lb.cache_aware import CacheAware
from kit.lb.config import WorkerSpec
from kit.lb.kv_index import KvIndex, RankCache, parse_descriptor
from kit.lb.protocol import ROOM_SPAN, parse_request, room_on_rank
from kit.lb.workers import Worker

BLOCK = 4


def prefills(n: int) -> list[Worker]:
    return [Worker(WorkerSpec(f"http://10.0.0.{i}:30000", "prefill", 8998)) for i in range(n)]


def stored(prompt: list[int]) -> wire.KVEventBatch:
    event = wire.BlockStored(
        block_hashes=block_hashes(prompt, BLOCK),
        parent_block_hash=None,
        token_ids=prompt,
        block_size=BLOCK,
        lora_id=None,
        medium=wire.GPU,
    )
    return wire.KVEventBatch(ts=0.0, events=[event])


def removed(prompt: list[int]) -> wire.KVEventBatch:
    return wire.KVEventBatch(
        ts=0.0, events=[wire.BlockRemoved(block_hashes=block_hashes(prompt, BLOCK))]
    )


def generate(ids: list[int]):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    return parse_request("/generate", json.dumps(body).encode())


PREFIX = list(range(1000, 1064))  # 16 blocks
PROMPT = [*PREFIX, 5, 6, 7]


def test_a_gap_in_sequence_numbers_clears_the_rank_and_keeps_only_what_follows():
    rank = RankCache()
    rank.receive(0, stored(PREFIX))
    other = list(range(2000, 2008))
    rank.receive(5, stored(other))  # batches 1-4 were lost: PREFIX may have been evicted
    assert rank.gaps == 1
    assert rank.cached_blocks(block_hashes(PREFIX, BLOCK)) == 0
    assert rank.cached_blocks(block_hashes(other, BLOCK)) == 2


def test_a_publisher_restart_clears_the_rank():
    rank = RankCache()
    rank.receive(0, stored(PREFIX))
    rank.receive(1, stored(list(range(3000, 3004))))
    rank.receive(0, wire.KVEventBatch(ts=0.0, events=[]))  # a new process counts from 0
    assert rank.restarts == 1 and not rank.blocks


def test_removed_and_cleared_blocks_leave_the_index_and_host_tiers_do_not_count():
    rank = RankCache()
    rank.receive(0, stored(PREFIX))
    rank.receive(1, removed(PREFIX[32:]))
    assert rank.cached_blocks(block_hashes(PREFIX, BLOCK)) == 16  # other hashes: not these
    rank.receive(2, removed(PREFIX))
    assert not rank.blocks
    host = stored(PREFIX)
    host.events[0].medium = "CPU_PINNED"
    rank.receive(3, host)
    assert not rank.blocks
    rank.receive(4, stored(PREFIX))
    rank.receive(5, wire.KVEventBatch(ts=0.0, events=[wire.AllBlocksCleared()]))
    assert not rank.blocks


def test_cache_aware_sends_a_prompt_to_the_rank_that_holds_its_prefix():
    index = KvIndex()
    ws = prefills(2)
    index.add(ws[0].url, BLOCK, 1)
    index.add(ws[1].url, BLOCK, 4)
    index.receive(ws[0].url, 0, 0, stored(list(range(9000, 9040))), now=0.0)
    index.receive(ws[1].url, 2, 0, stored(PREFIX), now=0.0)
    policy = CacheAware(index, random.Random(1), clock=lambda: 1.0)
    choice = policy.plan(ws, generate(PROMPT), b"k")
    assert (choice.worker, choice.dp_rank, choice.dp_size) == (ws[1], 2, 4)
    assert choice.predicted == 64 and choice.prompt_tokens == len(PROMPT)


def test_queued_prefill_work_outweighs_a_short_cached_prefix():
    index = KvIndex()
    ws = prefills(2)
    for w in ws:
        index.add(w.url, BLOCK, 1)
    index.receive(ws[0].url, 0, 0, stored(PREFIX[:8]), now=0.0)  # 8 tokens cached on 0
    index.receive(ws[1].url, 0, 0, stored([1, 1, 1, 1]), now=0.0)
    policy = CacheAware(index, random.Random(1), clock=lambda: 1.0)
    assert policy.plan(ws, generate(PROMPT), b"k").worker is ws[0]
    busy = policy.plan([ws[0]], generate(list(range(5000, 5400))), b"other")
    policy.begin(busy)  # 400 uncached tokens queued on 0
    # cost on 0: 400 + 67 - 8; on 1: 67 -> the idle one, despite 0's cached 8 tokens.
    assert policy.plan(ws, generate(PROMPT), b"k").worker is ws[1]
    policy.end(busy)
    policy.end(busy)  # a second end (retry paths) changes nothing
    assert policy.queued(ws[0].url) == 0
    assert policy.plan(ws, generate(PROMPT), b"k").worker is ws[0]


def test_without_live_indexes_or_token_ids_it_routes_like_prefix_affinity():
    index = KvIndex()
    ws = prefills(3)
    policy = CacheAware(index, random.Random(1))
    choice = policy.plan(ws, generate(PROMPT), b"key")
    assert choice.dp_rank is None and choice.predicted == -1
    text = parse_request("/generate", json.dumps({"text": "hello"}).encode())
    index.add(ws[0].url, BLOCK, 1)
    index.receive(ws[0].url, 0, 0, stored(PREFIX), now=0.0)
    assert policy.plan(ws, text, b"key").predicted == -1  # no tokenizer for text here


def test_a_dropped_worker_predicts_nothing_until_it_publishes_again():
    """A restart (unhealthy, then healthy: the subscriber drops the worker) never leaves
    entries behind: its prompts are predicted uncached, and its rank is left to chance."""
    index = KvIndex()
    ws = prefills(2)
    for w in ws:
        index.add(w.url, BLOCK, 1)
    index.receive(ws[0].url, 0, 0, stored(PREFIX), now=0.0)
    index.receive(ws[1].url, 0, 0, stored([3, 3, 3, 3]), now=0.0)
    policy = CacheAware(index, random.Random(1), clock=lambda: 1.0)
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == 64
    index.drop(ws[0].url)
    choice = policy.plan(ws, generate(PROMPT), b"k")
    assert choice.predicted in (0, -1)
    assert not (choice.worker is ws[0] and choice.predicted > 0)


def test_a_worker_that_stops_publishing_is_routed_as_if_uncached():
    now = [0.0]
    index = KvIndex(silence_s=5.0, silence_requests=3)
    ws = prefills(1)
    index.add(ws[0].url, BLOCK, 1)
    index.receive(ws[0].url, 0, 0, stored(PREFIX), now=0.0)
    policy = CacheAware(index, random.Random(1), clock=lambda: now[0])
    for _ in range(3):
        policy.begin(policy.plan(ws, generate(PROMPT), b"k"))
    now[0] = 4.0
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == 64  # 4 s: not yet silent
    now[0] = 6.0
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == -1
    assert index.workers[ws[0].url].size() == 0
    index.receive(ws[0].url, 0, 1, stored(PREFIX), now=6.5)  # it speaks again
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == 64


def test_a_room_on_a_rank_is_congruent_to_it_and_in_range():
    rng = random.Random(3)
    for _ in range(1000):
        dp = rng.randint(1, 16)
        rank = rng.randrange(dp)
        room = room_on_rank(rng.getrandbits(63) % ROOM_SPAN, rank, dp)
        assert room % dp == rank and 0 <= room < ROOM_SPAN
    assert room_on_rank(ROOM_SPAN - 1, 3, 8) % 8 == 3
    body, room = generate(PROMPT).encode("10.0.0.1", 8998, rng, dp_rank=(5, 8))
    assert room % 8 == 5 and json.loads(body)["bootstrap_room"] == room


def test_the_server_info_descriptor_gives_ports_topic_block_size_and_ranks():
    info = {"kv_events": wire.describe(port_base=5557, topic="kv", block_size=16, dp_size=4)}
    assert parse_descriptor(info) == (5557, "kv", 16, 4)
    assert parse_descriptor({"kv_events": None}) is None
    assert parse_descriptor({"kv_events": {"publisher": "zmq", "block_size": 0}}) is None
