"""`pdkit up` of a sim topology with `kv_pool:` (2 prefills, 1 decode, round-robin prefills):
the real Mooncake master starts first and the prefills are wired to it, so a prompt prefilled on
one prefill is loaded from the pool by the other (the bench record, the prefill's /metrics and
`pdkit status` say so); the master SIGKILLed under `pdkit bench` load fails no request, and
status names it down until supervisord has it back (empty); `pdkit down` stops it last and
leaves no process of the deployment running."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
import urllib.request
import uuid
from pathlib import Path

import yaml

from kit.observe.kvpool import evaluate_kv_pool, kv_pool_line
from kit.observe.probe import Prober
from kit.observe.prom import parse_metrics
from kit.observe.targets import KvPoolTarget
from kit.plan.resolve import resolve
from tests.support.local_deploy import (
    layout,
    pdkit,
    pids,
    processes_of,
    start_bench,
    write_topology,
)
from tests.support.ports import free_ports

PAGE = 16


def pool_topology(tmp_path, name):
    topology, data = write_topology(tmp_path, name)
    data["defaults"]["args"].pop("page-size")  # the pool's page_size sets it
    rpc, metrics, metadata = free_ports(3)
    data["kv_pool"] = {
        "bind": "127.0.0.1",
        "rpc_port": rpc,
        "metrics_port": metrics,
        "metadata_port": metadata,
        "segment_gb": 32,
        "protocol": "tcp",
        "page_size": PAGE,
    }
    data["router"]["prefill_policy"] = "round_robin"
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    return topology, data


def status(topology) -> tuple[str, dict[str, int]]:
    """`pdkit status`'s KV pool line (unwrapped) and its objects, clients and hits."""
    shown = pdkit("status", str(topology), timeout=60)
    text = " ".join(shown.stdout.split())
    found = re.search(r"KV pool .*?: up, (\d+) objects, .*?, (\d+) clients; .*?: (\d+) hits", text)
    assert found, shown.stdout + shown.stderr
    objects, clients, hits = map(int, found.groups())
    return text[found.start() :], {"objects": objects, "clients": clients, "hits": hits}


def cached_by_source(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        metrics = parse_metrics(answer.read().decode())
    return {
        s.labels["cache_source"]: s.value for s in metrics.samples("sglang:cached_tokens_total")
    }


def test_up_wires_the_pool_a_killed_master_fails_nothing_and_down_stops_it_last(tmp_path):
    name = f"pool-{uuid.uuid4().hex[:8]}"
    topology, _ = pool_topology(tmp_path, name)
    plan = resolve(topology)
    assert plan.kv_pool is not None
    pool = plan.kv_pool
    try:
        up = pdkit("up", str(topology), "--no-gate")
        assert up.returncode == 0, up.stdout + up.stderr
        running = pids(topology, name)
        assert pool.name in running and len(running) == 5, running

        # One shared prefix, prefills in turn: a first request computes it on one prefill and
        # writes it to the pool (waited for, so that nothing depends on how fast that is), the
        # load's first request on the other prefill loads it from the pool, later ones find it
        # in their own cache. Then the master dies under load: status names it down until
        # supervisord has it back, then restarted and empty, and the prefills use it again.
        prompts = ["--output-len", "4", "--input-len", "600", "--prefix-groups", "1",
                   "--prefix-share", "0.9"]  # fmt: skip
        warm = pdkit("bench", str(topology), "--rate", "8", "--requests", "1", *prompts,
                     "--no-predict", "--json", "--out", str(tmp_path / "warm"),
                     timeout=120)  # fmt: skip
        assert warm.returncode == 0, warm.stdout + warm.stderr
        (first,) = [json.loads(line) for line in (tmp_path / "warm" / "requests.jsonl").open()]
        deadline = time.monotonic() + 60
        line, shown = status(topology)
        while shown["objects"] == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            line, shown = status(topology)
        assert shown["objects"] > 0, line
        load = start_bench(topology, tmp_path / "bench", "--rate", "8", "--requests", "64",
                           *prompts)  # fmt: skip
        deadline = time.monotonic() + 60  # the bench's start-up and first requests
        line, shown = status(topology)
        while shown["hits"] == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            line, shown = status(topology)
        assert f"KV pool {pool.name} (127.0.0.1:{pool.metrics_port}): up, " in line, line
        assert shown["objects"] > 0 and shown["hits"] > 0 and shown["clients"] == 2, line
        assert "restarted" not in line, line
        master = running[pool.name]
        os.kill(master, signal.SIGKILL)
        seen = asyncio.run(pool_lines_until_back(plan))
        assert "): down: does not answer" in seen[0] and "prefixes are recomputed" in seen[0]
        assert "): up," in seen[-1], seen
        output, _ = load.communicate(timeout=120)
        assert load.returncode == 0, output
        point = json.loads((tmp_path / "bench" / "summary.json").read_text())["points"][0]
        assert point["ok"] == point["requests"] and point["errors"] == {}, point
        assert pids(topology, name)[pool.name] != master
        line, _ = status(topology)
        assert "): up, " in line and "restarted after its clients" in line, line

        records = [json.loads(line) for line in (tmp_path / "bench" / "requests.jsonl").open()]
        other = next(r for r in records if r["prefill"] != first["prefill"])  # its first there
        pooled = [r for r in records if r["cached_storage"]]
        assert pooled and all(r["prefill"] == other["prefill"] for r in pooled), records
        assert pooled[0] == other and other["cached_device"] == 0, (other, pooled[0])
        assert all(r["cached_storage"] % PAGE == 0 for r in pooled)
        assert cached_by_source(other["prefill"])["storage"] == sum(
            r["cached_storage"] for r in pooled
        )
        assert any(r["cached_device"] for r in records)  # the rest: each prefill's own cache

        # The prefills write to the restarted pool (the load may have ended before it was back).
        again = pdkit("bench", str(topology), "--rate", "8", "--requests", "8", "--output-len",
                      "4", "--input-len", "600", "--no-predict", "--json", "--out",
                      str(tmp_path / "again"), timeout=120)  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr
        line, shown = status(topology)
        assert shown["objects"] > 0, line
    finally:
        down = pdkit("down", str(topology), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes_of(name) == []
    log = Path(layout(topology, name).log_dir) / "supervisord.log"
    stopped = re.findall(r"INFO stopped: (\S+) ", log.read_text())
    assert stopped[-1] == pool.name and set(stopped) == set(running), stopped
    ports = [pool.rpc_port, pool.metrics_port, pool.metadata_port, plan.router.port]
    ports += [p for w in plan.workers for p in (w.http_port, w.bootstrap_port) if p]
    assert not [port for port in ports if listening(port)], ports


async def pool_lines_until_back(plan, timeout_s: float = 30.0) -> list[str]:
    """`pdkit status`'s KV pool line, probed every 50 ms from the master's death until it
    answers again: the lines from the first that says it is down."""
    pool = plan.kv_pool
    target = KvPoolTarget(pool.name, pool.host, pool.url)  # as targets_from_plan has it
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    async with Prober(timeout=1.0) as prober:
        while time.monotonic() < deadline:
            answers = await prober.kv_pool(target)
            assert answers is not None
            status = evaluate_kv_pool(answers)
            if status.state == "down" or seen:
                seen.append(kv_pool_line(status))
                if status.state == "up":
                    return seen
            await asyncio.sleep(0.05)
    raise AssertionError(f"the master did not come back in {timeout_s:g} s: {seen[-1:]}")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
