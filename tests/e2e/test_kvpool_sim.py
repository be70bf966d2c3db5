"""The KV pool on the sim, against the real Mooncake Store: a prompt prefilled on prefill-0 is
loaded from the pool by prefill-1 (its answer and its metrics say so), and with the master
killed the requests still succeed, recomputed."""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from kit.observe.prom import parse_metrics
from tests.support.kvpool import PoolCluster
from tests.support.sim_launch import SimProcess, request_json

ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "20"}
PAGE = 16


def prompt(seed: int, words: int = 400) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(words))


def pd_generate(prefill: SimProcess, bootstrap_port: int, decode: SimProcess, text: str) -> dict:
    """One PD request straight to the pair (the router's two legs); the decode's answer."""
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": random.randrange(1 << 40),
    }
    with ThreadPoolExecutor(2) as legs:
        first = legs.submit(request_json, prefill.url + "/generate", body)
        status, answer = request_json(decode.url + "/generate", body)
        assert first.result()[0] == 200
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer["meta_info"]


def cached_by_source(worker: SimProcess) -> dict[str, float]:
    status, text = request_json(worker.url + "/metrics")
    assert status == 200 and isinstance(text, str)
    metrics = parse_metrics(text)
    return {
        s.labels["cache_source"]: s.value for s in metrics.samples("sglang:cached_tokens_total")
    }


def test_a_prefix_computed_on_one_prefill_is_a_pool_hit_on_the_other():
    with PoolCluster(env=ENV) as cluster:
        (p0, p1), (b0, b1), decode = cluster.prefills, cluster.bootstrap_ports, cluster.decode
        text = prompt(1)
        first = pd_generate(p0, b0, decode, text)
        assert first["cached_tokens"] == 0
        # prefill-0 writes its pages through to the pool after it answers: wait for them.
        master = cluster.master
        assert master is not None
        deadline = time.monotonic() + 30
        while not parse_metrics(master.metrics()).total("master_key_count"):
            assert time.monotonic() < deadline, "prefill-0's pages never reached the pool"
            time.sleep(0.1)
        again = pd_generate(p1, b1, decode, text)
        details = again["cached_tokens_details"]
        assert details["storage"] > 0 and details["device"] == 0
        assert details["storage_backend"] == "MooncakeStore"
        assert again["cached_tokens"] == details["storage"]
        assert (
            again["cached_tokens"] % PAGE == 0 and again["cached_tokens"] < again["prompt_tokens"]
        )
        assert cached_by_source(p1).get("storage") == details["storage"]
        assert cached_by_source(p0).get("storage") is None
        pool = parse_metrics(master.metrics())
        assert (pool.total("master_key_count") or 0) >= details["storage"] // PAGE
        # The same prefix on prefill-0 again comes from its own cache (GPU), not the pool.
        local = pd_generate(p0, b0, decode, text)["cached_tokens_details"]
        assert local["device"] == details["storage"] and local["storage"] == 0

        # The master dies: requests keep succeeding, computing what the instance lacks.
        assert master.proc is not None
        master.proc.send_signal(signal.SIGKILL)
        master.proc.wait()
        fresh = pd_generate(p1, b1, decode, prompt(2))
        assert fresh["cached_tokens"] == 0
        pooled_before = pd_generate(p1, b1, decode, prompt(1) + " more")
        assert pooled_before["cached_tokens_details"]["device"] > 0  # its own copy still serves
        other = pd_generate(p0, b0, decode, prompt(2))
        assert other["cached_tokens"] == 0  # prompt 2 went to the pool only while it was down
        status, reply = request_json(
            cluster.url + "/v1/chat/completions",
            {"model": "llama", "messages": [{"role": "user", "content": prompt(3)}]},
        )
        assert status == 200 and isinstance(reply, dict)
        assert reply["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert "KV pool unreachable" in p1.log()
