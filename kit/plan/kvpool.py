"""Topology `kv_pool:` -> the Plan's KV pool master (Mooncake Store). Pure.

The master is `mooncake_master` from the Mooncake wheel, run as `python -m mooncake.cli` (the
wheel's own entry point, which execs the binary beside it, keeping the pid) with pdkit's
interpreter on its host. Its flags:

    --rpc_port / --rpc_address          the RPC service clients reach (MOONCAKE_MASTER)
    --metrics_port / --metrics_host     /metrics and /health (readiness, status, Prometheus)
    --enable_http_metadata_server       the embedded metadata server (metadata_server: embedded)
    --eviction_high_watermark_ratio, --eviction_ratio
"""

from __future__ import annotations

from kit.net import bare_host
from kit.sglang.hicache import (
    host_segment_bytes,
    master_address,
    metadata_url,
    pool_host,
    uses_pool,
)
from kit.topology.layout import KV_POOL_PROCESS, HostLayout, unit_name
from kit.topology.plan_types import Command, KvPoolProcess, WorkerProcess
from kit.topology.schema import Topology

MASTER_MODULE = "mooncake.cli"


def master_args(topology: Topology) -> tuple[str, ...]:
    """mooncake_master's flags for the topology's `kv_pool:` (gflags' --name=value form)."""
    pool = topology.kv_pool
    assert pool is not None
    bind = bare_host(pool.bind)
    args = [
        f"--rpc_port={pool.rpc_port}",
        f"--rpc_address={bind}",
        f"--metrics_port={pool.metrics_port}",
        f"--metrics_host={bind}",
        f"--eviction_high_watermark_ratio={pool.eviction_high_watermark:g}",
        f"--eviction_ratio={pool.eviction_ratio:g}",
    ]
    if pool.metadata_server == "embedded":
        args += [
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={bind}",
            f"--http_metadata_server_port={pool.metadata_port}",
        ]
    return tuple(args)


def build_kv_pool(
    topology: Topology, workers: list[WorkerProcess], layouts: dict[str, HostLayout]
) -> KvPoolProcess | None:
    """The master of a validated topology, None when `kv_pool:` is unset."""
    pool = topology.kv_pool
    if pool is None:
        return None
    host = topology.host(pool_host(topology))
    clients = [w for w in workers if uses_pool(topology, w.role)]
    per_host: dict[str, int] = {}
    for w in clients:
        per_host[w.host] = per_host.get(w.host, 0) + 1
    capacity = sum(host_segment_bytes(pool, h, n) * n for h, n in per_host.items())
    return KvPoolProcess(
        name=KV_POOL_PROCESS,
        host=host.name,
        address=bare_host(host.address),
        bind=bare_host(pool.bind),
        rpc_port=pool.rpc_port,
        metrics_port=pool.metrics_port,
        metadata_port=pool.metadata_port if pool.metadata_server == "embedded" else None,
        master_address=master_address(topology),
        metadata_url=metadata_url(topology),
        protocol=pool.protocol,
        page_size=pool.page_size,
        clients=tuple(w.name for w in clients),
        capacity_bytes=capacity,
        unit=unit_name(topology.name, KV_POOL_PROCESS),
        log_path=layouts[host.name].log_file(KV_POOL_PROCESS),
        # gflags' --name=value: each flag is one word.
        command=Command(module=MASTER_MODULE, flags=tuple((a,) for a in master_args(topology))),
        env={},
    )
