"""cache_aware's KV-event index and choice (no network): what a prefill has cached, and the
rules that keep the router from ever routing on entries a worker may no longer hold."""

from __future__ import annotations

import json
import random

from kit.kvevents import wire
from kit.kvevents.blocks import block_hashes
from kit.lb.cache_aware import CacheAware
from kit.lb.config import WorkerSpec
from kit.lb.kv_index import SERVED_GRACE_S, KvIndex, RankCache, parse_descriptor
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
    policy.end(busy, served=True)
    policy.end(busy, served=True)  # a second end (retry paths) changes nothing
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


def silence_case(now: list[float]) -> tuple[KvIndex, list[Worker], CacheAware]:
    """One prefill that published PREFIX at 0 s and is silent after 3 requests over 5 s."""
    index = KvIndex(silence_s=5.0, silence_requests=3)
    ws = prefills(1)
    index.add(ws[0].url, BLOCK, 1)
    index.receive(ws[0].url, 0, 0, stored(PREFIX), now=0.0)
    return index, ws, CacheAware(index, random.Random(1), clock=lambda: now[0])


def test_a_worker_that_stops_publishing_is_routed_as_if_uncached():
    now = [0.0]
    index, ws, policy = silence_case(now)
    for q in range(3):  # each should make the worker store (and publish) its question's block
        policy.begin(policy.plan(ws, generate([*PREFIX, *range(10 * q, 10 * q + 5)]), b"k"))
    now[0] = 4.0
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == 64  # 4 s: not yet silent
    now[0] = 6.0
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == -1
    assert index.workers[ws[0].url].size() == 0
    index.receive(ws[0].url, 0, 1, stored(PREFIX), now=6.5)  # it speaks again
    assert policy.plan(ws, generate(PROMPT), b"k").predicted == 64


def test_a_worker_serving_only_cache_hits_is_not_taken_for_silent():
    """A prompt whose blocks the index holds whole makes the worker store nothing, so it
    publishes nothing: many such requests, long after the last event, keep the index."""
    now = [0.0]
    index, ws, policy = silence_case(now)
    for _ in range(10):
        now[0] += 1.0
        choice = policy.plan(ws, generate(PROMPT), b"k")  # PREFIX's 16 blocks + 3 tokens
        assert choice.predicted == 64
        policy.begin(choice)
        policy.end(choice, served=True)
    assert index.workers[ws[0].url].live


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


# -- pending blocks: what the router sent to a rank before its events report it --------------

QUESTION_A = [*PREFIX, 5, 6, 7]
QUESTION_B = [*PREFIX, 8, 9, 10]


def live_prefills(
    n: int, dp: int = 1, now: list[float] | None = None, pending_s: float = 30.0
) -> tuple[KvIndex, list[Worker], CacheAware]:
    """`n` prefills whose (empty) indexes are live (each rank published one empty batch), and
    cache_aware over them on the clock `now` (1 s if None)."""
    index = KvIndex(pending_s=pending_s)
    ws = prefills(n)
    for w in ws:
        index.add(w.url, BLOCK, dp)
        for rank in range(dp):
            index.receive(w.url, rank, 0, wire.KVEventBatch(ts=0.0, events=[]), now=0.0)
    clock = now or [1.0]
    return index, ws, CacheAware(index, random.Random(1), clock=lambda: clock[0])


def test_a_request_sent_before_the_first_with_its_prefix_is_reported_joins_it():
    """The first request of a document is still prefilling (no event yet) and the other
    prefill is busy with a little work: the second request goes where the document will be
    cached, and is predicted to reuse it."""
    index, ws, policy = live_prefills(2)
    first = policy.plan(ws, generate(QUESTION_A), b"a")
    policy.begin(first)
    other = next(w for w in ws if w is not first.worker)
    small = policy.plan([other], generate(list(range(7000, 7010))), b"s")
    policy.begin(small)  # 10 tokens queued on the other prefill
    second = policy.plan(ws, generate(QUESTION_B), b"b")
    assert second.worker is first.worker
    assert second.predicted == 64 and second.pending == 64
    # Once the first one's blocks are reported, they are cached, no longer pending, and its
    # tokens have left the queue although its prefill leg (the KV transfer) has not ended.
    index.receive(first.worker.url, 0, 1, stored(QUESTION_A), now=1.0)
    assert index.workers[first.worker.url].pending_size() == 0
    assert policy.queued(first.worker.url) == 0
    third = policy.plan(ws, generate(QUESTION_B), b"b")
    assert third.worker is first.worker and (third.predicted, third.pending) == (64, 0)
    policy.end(first, served=True)
    assert policy.queued(first.worker.url) == 0


def test_under_dp_attention_a_concurrent_request_goes_to_the_rank_computing_its_prefix():
    _, ws, policy = live_prefills(1, dp=2)
    first = policy.plan(ws, generate(QUESTION_A), b"a")
    policy.begin(first)
    small = policy.plan(ws, generate(list(range(7000, 7010))), b"s")
    assert small.dp_rank != first.dp_rank
    policy.begin(small)
    second = policy.plan(ws, generate(QUESTION_B), b"b")
    assert (second.worker, second.dp_rank) == (first.worker, first.dp_rank)
    assert second.pending == 64


def test_pending_blocks_end_with_a_failed_prefill_and_soon_after_an_unreported_one():
    now = [1.0]
    index, ws, policy = live_prefills(1, now=now)
    failed = policy.plan(ws, generate(QUESTION_A), b"a")
    policy.begin(failed)
    assert policy.plan(ws, generate(QUESTION_B), b"b").pending == 64
    policy.end(failed, served=False)  # the prefill answered 5xx, or the leg was cancelled
    assert policy.plan(ws, generate(QUESTION_B), b"b").predicted == 0
    served = policy.plan(ws, generate(QUESTION_A), b"a")
    policy.begin(served)
    policy.end(served, served=True)  # answered, but no BlockStored follows
    assert policy.plan(ws, generate(QUESTION_B), b"b").pending == 64  # events trail a little
    now[0] += SERVED_GRACE_S + 0.1
    assert policy.plan(ws, generate(QUESTION_B), b"b").predicted == 0
    assert index.workers[ws[0].url].ranks[0].dropped == 2


def test_pending_blocks_expire_when_the_prefill_leg_never_ends():
    now = [1.0]
    index, ws, policy = live_prefills(1, now=now, pending_s=10.0)
    policy.begin(policy.plan(ws, generate(QUESTION_A), b"a"))
    now[0] = 10.5
    assert policy.plan(ws, generate(QUESTION_B), b"b").pending == 64
    now[0] = 11.5
    assert policy.plan(ws, generate(QUESTION_B), b"b").predicted == 0
    assert index.workers[ws[0].url].pending_size() == 0


def test_a_restart_or_an_event_gap_drops_pending_blocks_with_the_cached_ones():
    index, ws, policy = live_prefills(1, dp=2)
    on_0 = policy.plan(ws, generate(QUESTION_A), b"a")
    policy.begin(on_0)
    rank = on_0.dp_rank
    assert rank is not None
    # A gap on the rank: what happened there is unknown, pending blocks included.
    index.receive(ws[0].url, rank, 5, wire.KVEventBatch(ts=0.0, events=[]), now=1.0)
    again = policy.plan(ws, generate(QUESTION_B), b"b")
    assert again.predicted == 0
    policy.begin(again)
    assert policy.plan(ws, generate(QUESTION_B), b"b").pending == 64
    # The worker restarts (it left the routable set): nothing of it is believed.
    index.drop(ws[0].url)
    assert policy.plan(ws, generate(QUESTION_B), b"b").predicted == -1
    index.receive(ws[0].url, 0, 0, wire.KVEventBatch(ts=0.0, events=[]), now=2.0)
    assert policy.plan(ws, generate(QUESTION_B), b"b").predicted == 0
    # The old attempts' legs end later (they failed with the worker): nothing comes back.
    policy.end(on_0, served=False)
    policy.end(again, served=False)
    assert index.workers[ws[0].url].pending_size() == 0
    assert policy.queued(ws[0].url) == 0


def test_a_cached_prefix_holds_its_rank_until_the_queue_there_is_twice_its_compute():
    """The request also counts the work it leaves behind: on the idle prefill it would compute
    its 64-token prefix again, which everyone after it there would wait for."""
    index, ws, policy = live_prefills(2)
    index.receive(ws[0].url, 0, 1, stored(PREFIX), now=0.0)
    busy = policy.plan([ws[0]], generate(list(range(5000, 5100))), b"other")
    policy.begin(busy)  # 100 uncached tokens queued on 0: more than the prefix, under twice
    assert policy.plan(ws, generate(PROMPT), b"k").worker is ws[0]
    more = policy.plan([ws[0]], generate(list(range(6000, 6040))), b"more")
    policy.begin(more)  # 140 queued on 0: over twice the prefix's 64 tokens
    assert policy.plan(ws, generate(PROMPT), b"k").worker is ws[1]
