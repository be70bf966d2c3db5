"""Topology `kv_pool:` -> the HiCache flags and MOONCAKE_* environment of the workers that use
the pool (Mooncake Store as HiCache's L3, SGLang 0.5.23). Pure: no I/O.

A prefill that uses the pool starts with

    --enable-hierarchical-cache --hicache-storage-backend mooncake --page-size 64
    --hicache-mem-layout page_first --hicache-io-backend kernel --hicache-ratio 2
    --hicache-write-policy write_through --hicache-storage-prefetch-policy timeout

both roles `--enable-cache-report` (usage.prompt_tokens_details.cached_tokens), a decode with
`--page-size` (prefill and decode must agree) and, with `roles.decode_offload`,
`--disaggregation-decode-enable-offload-kvcache` and the same storage flags; each gets
MOONCAKE_MASTER, MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE,
MOONCAKE_GLOBAL_SEGMENT_SIZE and MOONCAKE_LOCAL_HOSTNAME (`srt/environ.py:882-894`, read by
`mem_cache/storage/mooncake_store/mooncake_store.py` `MooncakeStoreConfig.load_from_env`).
"""

from __future__ import annotations

from kit.net import bare_host, host_port, http_url
from kit.topology.schema import ArgValue, Host, KvPool, Topology

STORAGE_BACKEND = "mooncake"

POOL_FLAGS: dict[str, str] = {
    "enable-hierarchical-cache": "kv_pool.roles.prefill",
    "hicache-storage-backend": "kv_pool (the pool is Mooncake Store)",
    "page-size": "kv_pool.page_size",
    "hicache-mem-layout": "kv_pool.mem_layout",
    "hicache-io-backend": "kv_pool.io_backend",
    "hicache-ratio": "kv_pool.host_ratio",
    "hicache-write-policy": "kv_pool.write_policy",
    "hicache-storage-prefetch-policy": "kv_pool.prefetch_policy",
    "disaggregation-decode-enable-offload-kvcache": "kv_pool.roles.decode_offload",
    "hicache-storage-backend-extra-config": "kv_pool (pdkit passes the store's settings as "
    "MOONCAKE_* variables)",
}
"""Flags pdkit sets when the topology has `kv_pool:` -> the key to set instead."""

POOL_KEYS: dict[str, tuple[str, ...]] = {
    "enable-hierarchical-cache": ("roles", "prefill"),
    "page-size": ("page_size",),
    "hicache-mem-layout": ("mem_layout",),
    "hicache-io-backend": ("io_backend",),
    "hicache-ratio": ("host_ratio",),
    "hicache-write-policy": ("write_policy",),
    "hicache-storage-prefetch-policy": ("prefetch_policy",),
    "disaggregation-decode-enable-offload-kvcache": ("roles", "decode_offload"),
}
"""Flag -> its key under `kv_pool:` (problems with a rendered HiCache value point there)."""

POOL_ENV = (
    "MOONCAKE_MASTER",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_DEVICE",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_HOSTNAME",
)


def pool_host(topology: Topology) -> str:
    """The host the master runs on (call only with `kv_pool:` set)."""
    pool = topology.kv_pool
    assert pool is not None  # callers check; a None here is a programming error
    return pool.host or topology.router_host


def uses_pool(topology: Topology, role: str) -> bool:
    """Whether `role`'s workers are clients of the pool (and give it DRAM)."""
    pool = topology.kv_pool
    if pool is None:
        return False
    return pool.roles.prefill if role == "prefill" else pool.roles.decode_offload


def master_address(topology: Topology) -> str:
    """host:port of the master's RPC service (MOONCAKE_MASTER)."""
    pool = topology.kv_pool
    assert pool is not None
    return host_port(topology.host(pool_host(topology)).address, pool.rpc_port)


def metadata_url(topology: Topology) -> str:
    """The metadata server's URL (MOONCAKE_TE_META_DATA_SERVER): the master's embedded one,
    or the one the topology names."""
    pool = topology.kv_pool
    assert pool is not None
    if pool.metadata_server != "embedded":
        return pool.metadata_server
    return http_url(topology.host(pool_host(topology)).address, pool.metadata_port, "/metadata")


def pool_args(topology: Topology, role: str) -> dict[str, ArgValue]:
    """The HiCache flags of `role` (empty without `kv_pool:`): `--page-size` on both roles so
    that they agree, the L3 flags on the roles that use the pool."""
    pool = topology.kv_pool
    if pool is None:
        return {}
    # The decode answers the client: it reports the prefill's cache hits in usage.
    args: dict[str, ArgValue] = {"page-size": pool.page_size, "enable-cache-report": True}
    if not uses_pool(topology, role):
        return args
    if role == "prefill":
        args["enable-hierarchical-cache"] = True
        args["hicache-ratio"] = pool.host_ratio
    else:
        args["disaggregation-decode-enable-offload-kvcache"] = True
    args.update(
        {
            "hicache-storage-backend": STORAGE_BACKEND,
            "hicache-mem-layout": pool.mem_layout,
            "hicache-io-backend": pool.io_backend,
            "hicache-write-policy": pool.write_policy,
            "hicache-storage-prefetch-policy": pool.prefetch_policy,
        }
    )
    return args


def host_segment_bytes(pool: KvPool, host: str, clients: int) -> int:
    """Bytes one of `clients` pool-using processes on `host` gives the pool: the host's share
    (host_segment_gb, else segment_gb) split evenly."""
    gib = pool.host_segment_gb.get(host, pool.segment_gb)
    return int(gib * (1 << 30)) // max(clients, 1)


def pool_env(topology: Topology, role: str, host: Host, clients: int) -> dict[str, str]:
    """The MOONCAKE_* environment of a `role` process on `host` (empty where it does not use
    the pool); `clients` is how many pool-using processes the host runs."""
    pool = topology.kv_pool
    if pool is None or not uses_pool(topology, role):
        return {}
    devices = pool.devices or (host.rdma_devices if pool.protocol == "rdma" else ())
    return {
        "MOONCAKE_MASTER": master_address(topology),
        "MOONCAKE_TE_META_DATA_SERVER": metadata_url(topology),
        "MOONCAKE_PROTOCOL": pool.protocol,
        "MOONCAKE_DEVICE": ",".join(devices),
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(host_segment_bytes(pool, host.name, clients)),
        "MOONCAKE_LOCAL_HOSTNAME": bare_host(host.address),
    }
