"""Checks of the topology's `kv_pool:` (Mooncake Store as HiCache's L3): references, memory,
the store's protocol and devices, and the HiCache settings SGLang 0.5.23 would rewrite or that
defeat a shared pool. Each problem names the key and the fix.

SGLang's own start-up refusals of the rendered HiCache flags (kit/sglang/startup) run on top.
"""

from __future__ import annotations

from collections.abc import Iterator

from kit.errors import Problem
from kit.topology.schema import KvPool, Topology

_HICACHE_HOOK = "SGLang 0.5.23's hicache_hook.resolve_layout_io_compatibility"


def kv_pool_host(topology: Topology) -> str | None:
    """The host the master runs on; None without `kv_pool:` or when that host is unknown."""
    if topology.kv_pool is None:
        return None
    host = topology.kv_pool.host or topology.router_host
    return host if host in {h.name for h in topology.hosts} else None


def kv_pool_problems(topology: Topology) -> list[Problem]:
    """Every problem of `kv_pool:` (none without it)."""
    pool = topology.kv_pool
    if pool is None:
        return []
    return [
        *_references(topology, pool),
        *_memory(topology, pool),
        *_transport(topology, pool),
        *_hicache(pool),
    ]


def _references(topology: Topology, pool: KvPool) -> Iterator[Problem]:
    names = [h.name for h in topology.hosts]
    if pool.host is not None and pool.host not in names:
        yield Problem(
            ("kv_pool", "host"), f"no host named '{pool.host}'.", f"use one of: {', '.join(names)}."
        )
    for name in pool.host_segment_gb:
        if name not in names:
            yield Problem(
                ("kv_pool", "host_segment_gb", name),
                f"no host named '{name}'.",
                f"use one of: {', '.join(names)}.",
            )
    if pool.metadata_server != "embedded" and not pool.metadata_server.startswith(
        ("http://", "https://")
    ):
        yield Problem(
            ("kv_pool", "metadata_server"),
            f"'{pool.metadata_server}' is neither `embedded` nor an HTTP metadata server's URL.",
            "set metadata_server: embedded (the master's own), or a URL such as "
            "http://10.0.0.1:8080/metadata.",
        )
    if not (pool.roles.prefill or pool.roles.decode_offload):
        yield Problem(
            ("kv_pool", "roles"),
            "no role uses the pool: it would hold nothing.",
            "set roles.prefill: true (the default), or remove kv_pool.",
        )


def _client_hosts(topology: Topology, pool: KvPool) -> list[str]:
    """Hosts whose workers may use the pool: the pinned hosts of the roles that use it, else
    every host with room for them."""
    roles = [
        r
        for r, on in (("prefill", pool.roles.prefill), ("decode", pool.roles.decode_offload))
        if on
    ]
    hosts: list[str] = []
    for role in roles:
        pinned = getattr(topology, role).hosts
        for name in pinned or [h.name for h in topology.hosts]:
            if name not in hosts and name in {h.name for h in topology.hosts}:
                hosts.append(name)
    return hosts


def _memory(topology: Topology, pool: KvPool) -> Iterator[Problem]:
    clients = _client_hosts(topology, pool)
    total = sum(pool.host_segment_gb.get(h, pool.segment_gb) for h in clients)
    if clients and total <= 0:
        yield Problem(
            ("kv_pool", "segment_gb"),
            "no host gives the pool any memory: every put would fail.",
            "set segment_gb above 0, or give a host memory in host_segment_gb.",
        )


def _transport(topology: Topology, pool: KvPool) -> Iterator[Problem]:
    if pool.protocol == "tcp":
        return
    if topology.engine == "sim":
        return  # the sim moves pages over TCP and charges the rdma link's time
    for name in _client_hosts(topology, pool):
        host = topology.host(name)
        if host.device == "cpu":
            yield Problem(
                ("kv_pool", "protocol"),
                f"rdma on host {name}, a CPU host (no RDMA device is used there).",
                "set kv_pool.protocol: tcp.",
            )
        elif not (pool.devices or host.rdma_devices):
            yield Problem(
                ("kv_pool", "protocol"),
                f"rdma needs RDMA devices, and host {name} lists none (Mooncake would fall "
                "back to TCP without saying so).",
                f"list hosts[{name}].rdma_devices or kv_pool.devices, or set kv_pool.protocol: "
                "tcp.",
            )


def _hicache(pool: KvPool) -> Iterator[Problem]:
    if pool.mem_layout == "layer_first":
        fix = "page_first_direct" if pool.io_backend == "direct" else "page_first"
        yield Problem(
            ("kv_pool", "mem_layout"),
            "the mooncake storage backend does not take layer_first for MHA models (SGLang "
            f"0.5.23 rewrites it to {fix} at start: hicache_hook."
            "resolve_storage_layout_compatibility).",
            f"set mem_layout: {fix}.",
        )
    elif pool.mem_layout == "page_first" and pool.io_backend == "direct":
        yield Problem(
            ("kv_pool", "mem_layout"),
            f"page_first does not work with io_backend direct ({_HICACHE_HOOK} switches it "
            "to page_first_direct).",
            "set mem_layout: page_first_direct, or io_backend: kernel.",
        )
    elif pool.mem_layout == "page_first_direct" and pool.io_backend == "kernel":
        yield Problem(
            ("kv_pool", "io_backend"),
            f"the kernel io backend does not take page_first_direct ({_HICACHE_HOOK} switches "
            "it to direct).",
            "set io_backend: direct, or mem_layout: page_first.",
        )
    if pool.write_policy == "write_back":
        yield Problem(
            ("kv_pool", "write_policy"),
            "with write_back a page reaches the pool only when host memory evicts it, so "
            "another prefill seldom finds a fresh prefix there.",
            "set write_policy: write_through (or write_through_selective).",
        )
