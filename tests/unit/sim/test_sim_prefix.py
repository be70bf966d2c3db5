"""The sim's prefix cache: page keys name whole prefixes, the local LRU keeps what fits."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from kit.sim.prefix import LocalCache, PoolSettings, page_bytes, page_keys, parse_size
from kit.sim.prefix_cache import PrefixCache
from tests.support.ports import free_port
from tests.support.sim_server import serve


def test_a_page_key_names_the_whole_prefix_up_to_its_page():
    a = page_keys(list(range(40)), 16, "m")
    b = page_keys([*range(16), 99, *range(17, 40)], 16, "m")
    assert len(a) == 2  # the 8 tokens of the partial page are not cached
    assert a[0] == b[0] and a[1] != b[1]
    assert page_keys(list(range(40)), 16, "other")[0] != a[0]  # deployments stay apart


def test_the_local_cache_matches_leading_pages_and_evicts_the_oldest():
    cache = LocalCache(3)
    cache.insert(["a", "b", "c"])
    assert cache.match(["a", "b", "x", "c"]) == 2
    cache.insert(["d"])  # c was used least recently
    assert cache.match(["c"]) == 0 and cache.match(["a", "b", "d"]) == 3


def test_pool_settings_come_from_the_mooncake_environment():
    assert PoolSettings.from_env({}, "h") is None
    env = {"MOONCAKE_MASTER": "10.0.0.1:50051", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "4gb"}
    settings = PoolSettings.from_env(env, "10.0.0.2")
    assert settings is not None
    assert (settings.local_hostname, settings.global_segment_bytes) == ("10.0.0.2", 4 << 30)
    assert settings.protocol == "rdma"  # SGLang's default
    assert parse_size("1048576") == 1 << 20
    assert page_bytes("k", 10) == page_bytes("k", 10) != page_bytes("j", 10)


def test_a_request_queued_behind_its_prefix_finds_it_cached_once_that_one_is_prefilled():
    """The radix cache is matched when the scheduler takes a request into a prefill batch
    (SGLang's get_new_batch_prefill), not when it is queued: the second request of a document,
    sent while the first is still being prefilled, reuses its pages."""

    async def main():
        config = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv"}
        api, server = await serve(
            ["--kv-events-config", json.dumps(config)], env={"PDKIT_SIM_SPEED": "1"}
        )
        api.ready = True
        prompt = [(7 * i) % 900 + 5 for i in range(4000)]
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}
        try:
            async with aiohttp.ClientSession() as http:

                async def send(delay: float) -> dict:
                    await asyncio.sleep(delay)
                    async with http.post(server.make_url("/generate"), json=body) as r:
                        assert r.status == 200
                        return (await r.json())["meta_info"]

                first, second = await asyncio.gather(send(0), send(0.03))
        finally:
            await server.close()
            await api.engine.close()
        assert first["cached_tokens"] == 0
        assert first["e2e_latency"] > 0.03  # the second was queued while the first prefilled
        assert second["cached_tokens"] == 3999  # all but its last token (page size 1)

    asyncio.run(main())


def test_the_recent_hit_rate_covers_the_last_15_seconds_of_matches():
    """What the sim's /v1/loads scales a waiting request's prompt by (SGLang's estimate of its
    uncached tokens): the cached share of the prompts matched in the window."""
    cache = PrefixCache(page_size=4, capacity_pages=100, publisher=None)
    prompt = list(range(1, 42))
    assert cache.match(prompt, now=0.0) == 0
    cache.insert(prompt)
    assert cache.match(prompt, now=10.0) == 40
    assert cache.recent_hit_rate(10.0) == 40 / 82
    assert cache.recent_hit_rate(15.5) == 40 / 41  # the miss at 0 s left the window
    assert cache.recent_hit_rate(30.0) == 0.0
