"""The topology schema: shape only. Meaning (GPUs, ports, agreement between roles) is checked
in `validate.py`; this module only says which keys exist and what type each value has.

Every model is frozen and rejects unknown keys. Field descriptions are the user documentation:
`pdkit schema` prints them as JSON Schema and the topology reference in docs/topology.md is
generated from them (tools/gen_docs_reference.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kit.topology import ports
from kit.topology.autoscale_schema import Autoscale
from kit.topology.client_limits import ClientLimit, limits_problem
from kit.topology.cluster import Cluster
from kit.topology.launch import Parallelism
from kit.topology.router_ha import RouterTls, RouterVip
from kit.topology.router_schema import Admission, Canary, Faults
from kit.topology.slurm_schema import Slurm, stand_in_hosts
from kit.topology.strict import Strict

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"

ArgScalar = str | int | float | bool
ArgValue = ArgScalar | list[ArgScalar] | None
"""A value in `args:`. `true` renders a bare flag, `false` and `null` render nothing, a list
renders the flag once followed by each item."""

Engine = Literal["sglang", "sim"]
TransferBackend = Literal["mooncake", "mooncake_tcp", "nixl"]
RouterKind = Literal["pdkit", "smg"]
ServiceManager = Literal["systemd", "supervisord"]
Launcher = Literal["ansible", "slurm"]
Device = Literal["cuda", "cpu"]


class Model(Strict):
    """The model every prefill and decode instance serves."""

    path: str = Field(
        description="Hugging Face repo id (e.g. meta-llama/Llama-3.1-8B-Instruct) or a path "
        "that exists on every host; one starting with ./ or ../ is taken from the topology "
        "file's folder (for hosts that see the control machine's files, like a local one). "
        "Rendered as --model-path.",
        min_length=1,
    )
    served_name: str | None = Field(
        None, description="Name clients use in the `model` field; default: the path."
    )
    revision: str | None = Field(None, description="Git revision of the HF repo (--revision).")
    trust_remote_code: bool = Field(False, description="Pass --trust-remote-code.")

    @property
    def name(self) -> str:
        """The name clients send in requests."""
        return self.served_name or self.path


class SSH(Strict):
    """How Ansible reaches a host over SSH."""

    user: str = Field("root", description="SSH user; needs sudo for provisioning.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    key: str | None = Field(None, description="Private key file on the control machine.")


class Host(Strict):
    """A machine pdkit deploys to."""

    name: str = Field(pattern=NAME_PATTERN, description="Short unique name, used everywhere.")
    address: str = Field(
        min_length=1,
        description="Address the other hosts and the control machine reach this host at. "
        "Workers bind it and the transfer engine advertises it.",
    )
    connection: Literal["ssh", "local"] = Field(
        "ssh", description="`local` runs Ansible on the control machine itself, without SSH."
    )
    ssh: SSH = Field(default_factory=SSH, description="SSH settings (connection: ssh).")
    device: Device = Field(
        "cuda",
        description="What the workers compute on: `cuda` (GPUs) or `cpu` (a host without "
        "GPUs: set gpus: 0). Engine sglang on a CPU host renders --device cpu and SGLang's CPU "
        "flags and environment (kit/sglang/cpu.py); each instance there is one process per "
        "host using no GPU (a tp N instance spans N CPU hosts), and KV moves over TCP "
        "(transfer.backend: mooncake_tcp).",
    )
    gpus: int = Field(
        ge=0, description="Number of GPUs (emulated ones for engine sim; 0 on a CPU host)."
    )
    gpu_type: str | None = Field(
        None,
        description="GPU model, e.g. H100-SXM, A100-80G. kit/perf models the instances on it "
        "(bench's prediction, size --calibrate), whatever the engine; the sim engine times "
        "itself by it.",
    )
    rdma_devices: tuple[str, ...] = Field(
        (), description="RDMA devices (names under /sys/class/infiniband), e.g. [mlx5_0, mlx5_1]."
    )
    gpu_nics: dict[int, str] = Field(
        default_factory=dict,
        description="GPU index -> RDMA device, for hosts with one NIC per GPU (or per GPU pair). "
        "Rendered as the per-GPU JSON map of --disaggregation-ib-device.",
    )
    network_interface: str | None = Field(
        None,
        description="The network interface that carries `address` (e.g. eth0, bond0; "
        "`ip -o addr show to ADDRESS`). Rendered as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME "
        "for multi-node and DeepEP instances; a multi-node instance needs it, since gloo may "
        "otherwise bind the 127.0.1.1 Ubuntu maps the host name to.",
    )
    service_manager: ServiceManager = Field(
        "systemd",
        description="What runs pdkit's processes: systemd, or supervisord where "
        "there is no systemd (containers, the local default, test hosts).",
    )
    root: str = Field(
        "/",
        description="Root prefix for everything pdkit installs and writes on this host "
        "(several emulated hosts can share one machine with different roots).",
    )
    sglang_python: str | None = Field(
        None,
        description="Interpreter that runs engine sglang's workers on this host, when SGLang "
        "lives in a venv of its own (e.g. .venv-sglang-cpu/bin/python); a relative path is "
        "taken from the topology file's folder, like `root`. Default: the interpreter of pdkit's "
        "processes (the control machine's venv on a local host, the provisioned venv on a "
        "remote one). The router and the sim always run on pdkit's.",
    )


class RoleDefaults(Strict):
    """Settings shared by prefill and decode; a role's own `args`/`env` win key by key."""

    args: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="Extra SGLang launch_server flags, without leading dashes "
        "(chunked-prefill-size: 8192). Checked against SGLang's parser for the pinned version.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")


class KvEvents(Strict):
    """SGLang's KV cache events (--kv-events-config, a ZMQ publisher per DP rank): each
    worker publishes what its radix cache stores and evicts, and pdkit's router keeps an index
    of it for the `cache_aware` prefill policy. `kv_events: {}` turns them on with defaults."""

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"First publisher port on each host: an instance takes one port per DP "
        f"rank (port + rank), the next instance on the host the ports after. Default: prefill "
        f"{ports.PREFILL_KV_EVENTS}, decode {ports.DECODE_KV_EVENTS}.",
    )
    topic: str = Field(
        "kv", pattern=r"^[A-Za-z0-9_.-]*$", description="ZMQ topic the events are sent under."
    )


class RoleSpec(RoleDefaults):
    """The prefill or the decode instances."""

    count: int = Field(1, ge=1, description="Number of instances.")
    tp: int = Field(1, ge=1, description="Tensor parallel size per instance (--tp-size).")
    dp: int = Field(
        1,
        ge=1,
        description="Data parallel size: replicas (--dp-size), or with dp_attention the "
        "attention-DP ranks (--attn-dp-size).",
    )
    dp_attention: bool = Field(
        False, description="DP attention (--attn-dp-size dp): dp ranks share the tp GPUs."
    )
    ep: int = Field(1, ge=1, description="Expert parallel size (--ep-size).")
    pp: int = Field(1, ge=1, description="Pipeline parallel size (--pp-size).")
    hosts: tuple[str, ...] = Field(
        (), description="Pin the instances to these hosts (in order); default: any host."
    )
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"First HTTP port on each host (next instance on the same host: +1). "
        f"Default: prefill {ports.PREFILL_HTTP}, decode {ports.DECODE_HTTP}.",
    )
    bootstrap_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"Prefill only: first bootstrap port on each host (+1 per instance). "
        f"Default {ports.BOOTSTRAP}.",
    )
    dist_init_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"Multi-node and DP-attention instances: first --dist-init-addr port on the "
        f"rank-0 host "
        f"(+{ports.DIST_INIT_STRIDE} per instance). Default: prefill {ports.PREFILL_DIST_INIT}, "
        f"decode {ports.DECODE_DIST_INIT}.",
    )
    nccl_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"First --nccl-port (torch.distributed's port) on each host, +1 per "
        f"instance, so that servers starting together never pick the same one and none lands "
        f"on a port pdkit plans. Default: prefill {ports.PREFILL_NCCL}, decode "
        f"{ports.DECODE_NCCL}.",
    )
    bind: str | None = Field(
        None,
        description="Address the server binds (--host). Default: the host's address. "
        "A prefill must bind a routable address when a decode runs on another host.",
    )
    kv_events: KvEvents | None = Field(
        None,
        description="Publish the radix cache's KV events (off unless set; `{}`: defaults). On "
        "a decode only with its radix cache on (disaggregation-decode-enable-radix-cache).",
    )

    @property
    def parallelism(self) -> Parallelism:
        """The role's tp, dp, dp_attention, ep and pp as one value."""
        return Parallelism(
            tp=self.tp, dp=self.dp, dp_attention=self.dp_attention, ep=self.ep, pp=self.pp
        )

    @property
    def gpus_per_instance(self) -> int:
        """GPUs one instance uses across all its nodes."""
        return self.parallelism.gpus


class PDTimeouts(Strict):
    """SGLang's PD handoff timeouts, rendered into every worker's env (a role's `env:` that sets
    the variable wins). The defaults are SGLang 0.5.23's. pdkit's router waits for a prefill
    leg and a whole request at least bootstrap + waiting, and smg for a request, so that the
    workers' own error, which names the timeout, reaches the client first (docs/lb.md)."""

    bootstrap_timeout_s: int = Field(
        300,
        ge=1,
        description="Prefill: how long a request waits for its decode to reserve KV room "
        "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT); a loaded cluster with long queues needs more.",
    )
    waiting_timeout_s: int = Field(
        300,
        ge=1,
        description="Decode: how long a request waits for its KV after reserving room "
        "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT).",
    )
    heartbeat_interval_s: float = Field(
        5.0,
        ge=2,
        description="Decode: seconds between its pings of each prefill's bootstrap server "
        "(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL; SGLang raises anything below 2 to 2).",
    )
    heartbeat_max_failures: int = Field(
        2,
        ge=1,
        description="Decode: missed pings after which a prefill is offline and the requests "
        "waiting on it fail (SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE).",
    )


class Transfer(Strict):
    """How KV moves from prefill to decode."""

    backend: TransferBackend = Field(
        "mooncake",
        description="mooncake (RDMA), mooncake_tcp (Mooncake over TCP, no RDMA needed) or nixl.",
    )
    ib_devices: Literal["per_gpu", "host"] | tuple[str, ...] | None = Field(
        None,
        description="RDMA devices for the transfer engine. `per_gpu`: each host's gpu_nics map; "
        "`host`: all of the host's rdma_devices; a list: these devices on every host. "
        "Default: per_gpu where a host has gpu_nics, else host.",
    )
    gid_index: int | None = Field(
        None,
        ge=0,
        description="RoCE GID index (MC_GID_INDEX, NCCL_IB_GID_INDEX, NVSHMEM_IB_GID_INDEX); a "
        "wrong or missing one fails transfers (Mooncake falls back to 3). Required on RoCE; "
        "default: the IPv4-mapped RoCE v2 index common to the workers' NICs in `pdkit discover`'s "
        "facts.",
    )
    fabric: Literal["infiniband", "roce"] | None = Field(
        None,
        description="The RDMA NICs' link layer: `roce` (Ethernet: transfer.gid_index required) "
        "or `infiniband`. Default: what `pdkit discover` found (unknown without its facts: a "
        "warning for an RDMA backend on engine sglang).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra Mooncake variables (MC_*), set on every worker."
    )
    timeouts: PDTimeouts = Field(
        default_factory=PDTimeouts,
        description="PD handoff timeouts and the decode's heartbeat of its prefills.",
    )


class Router(Strict):
    """The load balancer in front of the workers."""

    kind: RouterKind = Field("pdkit", description="pdkit (pdkit's PD load balancer) or smg.")
    host: str | None = Field(None, description="Host name to run on; default: the first host.")
    hosts: list[str] | None = Field(
        None,
        min_length=2,
        description="Replicas: the hosts that each run the router (instead of `host`); with "
        "`vip`, keepalived holds one address for them. See docs/lb.md.",
    )
    vip: RouterVip | None = Field(
        None,
        description="The virtual IP clients use, moved between the `hosts` by keepalived "
        "(installed by provisioning) when the router or its host dies.",
    )
    port: int = Field(ports.ROUTER, ge=1, le=65535, description="Client-facing port.")
    bind: str = Field("0.0.0.0", description="Address the router binds.")
    metrics_port: int = Field(
        ports.ROUTER_METRICS,
        ge=1,
        le=65535,
        description="smg only: Prometheus port (pdkit serves /metrics on `port`).",
    )
    prefill_policy: str | None = Field(
        None,
        description="Prefill selection policy; default: prefix_affinity (pdkit), "
        "smg's default (smg).",
    )
    decode_policy: str | None = Field(
        None, description="Decode selection policy; default: least_inflight (pdkit), smg's default."
    )
    api_key_env: str | None = Field(
        None,
        description="Name of an environment variable on the control machine holding the "
        "API key clients must send. Never put the key itself in the topology.",
    )
    api_key_file: str | None = Field(
        None, description="File on the control machine holding the API key."
    )
    admission: Admission = Field(
        default_factory=Admission,
        description="SLO-aware admission: 429 at once for requests predicted to miss the SLO.",
    )
    faults: Faults = Field(
        default_factory=Faults,
        description="Retries, ejection, the hold and stream migration when a worker fails.",
    )
    canary: Canary = Field(
        default_factory=Canary,
        description="The token canary: every pair's tokens compared at an interval, a "
        "disagreeing worker taken out (pdkit router only).",
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="pdkit only: router processes on the router host, sharing its port "
        "(SO_REUSEPORT), one core each. See docs/lb.md.",
    )
    tls: RouterTls | None = Field(
        None, description="pdkit only: TLS on the client port (certificate files on the host)."
    )
    limits: list[ClientLimit] = Field(
        default_factory=list,
        description="pdkit only: token buckets per client API key (requests and prompt tokens "
        "per second); a client over its limit gets 429 with Retry-After. See docs/lb.md.",
    )
    args: dict[str, ArgValue] = Field(
        default_factory=dict, description="Extra router flags, without leading dashes."
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> Router:
        if self.api_key_env and self.api_key_file:
            raise ValueError("set only one of api_key_env and api_key_file")
        if self.host is not None and self.hosts is not None:
            raise ValueError("set host (one router) or hosts (replicas), not both")
        if self.hosts is not None and len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts: each host once")
        if self.vip is not None and self.hosts is None:
            raise ValueError("vip: list the router's replicas in hosts (two or more)")
        if self.processes > 1 and self.kind != "pdkit":
            raise ValueError("processes: only pdkit's router runs several; set kind: pdkit")
        if self.tls is not None and self.kind != "pdkit":
            raise ValueError("tls: only pdkit's router serves TLS here; set kind: pdkit")
        if self.limits and self.kind != "pdkit":
            raise ValueError("limits: only pdkit's router limits clients; set kind: pdkit")
        problem = limits_problem(self.limits)
        if problem:
            raise ValueError(f"limits: {problem}")
        if self.admission.enabled and self.kind != "pdkit":
            raise ValueError(
                "admission.enabled: only pdkit's router admits by SLO; set kind: pdkit, or "
                "admission.enabled: false"
            )
        return self


class Monitoring(Strict):
    """Prometheus for the deployment: `pdkit up` runs Debian's `prometheus` package on one host
    (under systemd or supervisord, like every pdkit process) with a scrape configuration
    rendered from the Plan: the router, every worker and smg's metrics port. `monitoring: {}`
    turns it on with these defaults; `pdkit dashboard` prints a Grafana dashboard for it."""

    host: str | None = Field(None, description="Host to run Prometheus on; default: the router's.")
    port: int = Field(ports.PROMETHEUS, ge=1, le=65535, description="Prometheus' HTTP port.")
    bind: str = Field("0.0.0.0", description="Address Prometheus listens on.")
    scrape_interval_s: float = Field(
        5.0, ge=1, le=300, description="Seconds between scrapes of every target."
    )
    retention: str = Field(
        "15d",
        pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$",
        description="How long Prometheus keeps samples (--storage.tsdb.retention.time), "
        "e.g. 15d. The data survives `pdkit down`.",
    )
    node_exporter_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Also scrape a node exporter at this port on every host (Debian's "
        "prometheus-node-exporter listens on 9100; pdkit does not install it).",
    )


KvPoolProtocol = Literal["rdma", "tcp"]
HiCacheLayout = Literal["page_first", "page_first_direct", "layer_first"]
HiCacheIoBackend = Literal["kernel", "direct"]
HiCacheWritePolicy = Literal["write_through", "write_through_selective", "write_back"]
HiCachePrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]


class KvPoolRoles(Strict):
    """Which workers use the pool."""

    prefill: bool = Field(
        True,
        description="Prefills use the pool as HiCache's L3 (--enable-hierarchical-cache "
        "--hicache-storage-backend mooncake): a prefix one prefill computed is loaded by any.",
    )
    decode_offload: bool = Field(
        False,
        description="Decodes also write the KV of finished requests to the pool "
        "(--disaggregation-decode-enable-offload-kvcache), so a later turn's prefill finds it.",
    )


class KvPool(Strict):
    """A KV cache pool in the cluster's DRAM: Mooncake Store, used by SGLang's HiCache as its
    L3. `pdkit up` starts the store's master (`mooncake_master` from the Mooncake wheel, with its
    HTTP metadata server embedded) before the workers and stops it after them; each worker that
    uses the pool gives it `segment_gb` of its host's DRAM (its global segment) and gets the
    HiCache flags and the MOONCAKE_* environment. `kv_pool: {}` turns it on with these
    defaults. See docs/kvpool.md."""

    host: str | None = Field(None, description="Host to run the master on; default: the router's.")
    bind: str = Field("0.0.0.0", description="Address the master's ports bind.")
    rpc_port: int = Field(
        ports.KV_POOL_RPC, ge=1, le=65535, description="The master's RPC port (MOONCAKE_MASTER)."
    )
    metrics_port: int = Field(
        ports.KV_POOL_METRICS,
        ge=1,
        le=65535,
        description="The master's HTTP port for /metrics and /health (readiness, status, "
        "Prometheus).",
    )
    metadata_server: str = Field(
        "embedded",
        description="Where the store's clients publish their segments: `embedded` (the "
        "master's own HTTP metadata server on metadata_port), or the URL of one that runs "
        "elsewhere (http://host:port/metadata), which pdkit does not deploy.",
    )
    metadata_port: int = Field(
        ports.KV_POOL_METADATA,
        ge=1,
        le=65535,
        description="Port of the embedded HTTP metadata server (metadata_server: embedded).",
    )
    segment_gb: float = Field(
        4.0,
        ge=0,
        description="DRAM each host gives the pool, GiB (split evenly among the processes "
        "there that use it: each one's MOONCAKE_GLOBAL_SEGMENT_SIZE). 0: clients only, the "
        "pool then lives on the hosts in host_segment_gb.",
    )
    host_segment_gb: dict[str, float] = Field(
        default_factory=dict,
        description="Host name -> DRAM it gives the pool, GiB, where it differs from segment_gb.",
    )
    protocol: KvPoolProtocol = Field(
        "rdma",
        description="How pages move between a worker and the pool (MOONCAKE_PROTOCOL): rdma "
        "(the hosts' RDMA devices) or tcp.",
    )
    devices: tuple[str, ...] = Field(
        (),
        description="RDMA devices the store's transfer engine uses (MOONCAKE_DEVICE); default: "
        "each host's rdma_devices.",
    )
    eviction_high_watermark: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of the pool in use at which the master evicts "
        "(--eviction_high_watermark_ratio).",
    )
    eviction_ratio: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Share of the objects evicted each time (--eviction_ratio).",
    )
    roles: KvPoolRoles = Field(
        default_factory=KvPoolRoles, description="Which workers use the pool."
    )
    page_size: int = Field(
        64,
        ge=1,
        description="Tokens per KV page (--page-size on every worker: prefill and decode must "
        "agree, and the pool stores whole pages).",
    )
    mem_layout: HiCacheLayout = Field(
        "page_first",
        description="Host memory layout of HiCache's L2 (--hicache-mem-layout): page_first "
        "with io_backend kernel, page_first_direct with direct. Mooncake refuses layer_first "
        "for MHA models.",
    )
    io_backend: HiCacheIoBackend = Field(
        "kernel",
        description="How pages move between GPU and host memory (--hicache-io-backend).",
    )
    write_policy: HiCacheWritePolicy = Field(
        "write_through",
        description="When pages reach the pool (--hicache-write-policy): write_through (as "
        "soon as computed, so another prefill finds them), write_through_selective (pages hit "
        "more than once), write_back (only on eviction from host memory).",
    )
    prefetch_policy: HiCachePrefetchPolicy = Field(
        "timeout",
        description="When a prefetch from the pool stops (--hicache-storage-prefetch-policy): "
        "best_effort, wait_complete, or timeout.",
    )
    host_ratio: float = Field(
        2.0,
        gt=0,
        description="HiCache's L2 (host memory) size as a multiple of the GPU KV pool "
        "(--hicache-ratio); at or below 1 SGLang warns that the L2 adds little.",
    )


class SLO(Strict):
    """Service level objective, used by status and bench."""

    ttft_ms: float = Field(400.0, gt=0, description="Time to first token target (ms).")
    tpot_ms: float = Field(40.0, gt=0, description="Time per output token target (ms).")
    attainment: float = Field(
        0.9, gt=0, le=1, description="Share of requests that must meet both targets."
    )


class Topology(Strict):
    """One PD deployment: model, hosts, prefill and decode instances, transfer and router."""

    name: str = Field(pattern=NAME_PATTERN, description="Deployment name (state, service names).")
    engine: Engine = Field(
        "sglang", description="sglang (real workers) or sim (pdkit's emulated worker, no GPU)."
    )
    sglang_version: str = Field(
        "0.5.23", description="SGLang version the hosts run; its flag catalog checks `args`."
    )
    model: Model = Field(description="The model served by every instance.")
    launcher: Launcher = Field(
        "ansible",
        description="What starts the processes: `ansible` (over SSH, systemd or supervisord "
        "on each host) or `slurm` (one allocation, each process a job step; see `slurm:` and "
        "docs/slurm.md).",
    )
    slurm: Slurm | None = Field(
        None,
        description="launcher: slurm only: the allocation (nodes, GPUs per node, partition, "
        "time limit, ...) and the environment on the nodes.",
    )
    hosts: Annotated[tuple[Host, ...], Field(min_length=1)] = Field(
        description="The machines, in placement order. With launcher: slurm, leave it out: the "
        "hosts are the allocation's nodes, node0 ... node<N-1> (`slurm.nodes`).",
    )
    defaults: RoleDefaults = Field(
        default_factory=RoleDefaults, description="args/env shared by prefill and decode."
    )
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="The prefill instances.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="The decode instances.")
    transfer: Transfer = Field(default_factory=Transfer, description="How KV moves.")
    router: Router = Field(default_factory=Router, description="The load balancer.")
    slo: SLO = Field(default_factory=SLO, description="Latency targets for status and bench.")
    monitoring: Monitoring | None = Field(
        None, description="Prometheus scraping the deployment (off unless set; `{}`: defaults)."
    )
    kv_pool: KvPool | None = Field(
        None,
        description="A KV cache pool in the cluster's DRAM (Mooncake Store as HiCache's L3; "
        "off unless set; `{}`: defaults).",
    )
    cluster: Cluster = Field(
        default_factory=Cluster,
        description="Timeouts and caches of a large or wide-EP cluster (`profile: wide_ep`).",
    )
    autoscale: Autoscale | None = Field(
        None,
        description="`pdkit autoscale`'s limits on moving instances between roles (off unless "
        "set; `{}`: defaults).",
    )

    @model_validator(mode="before")
    @classmethod
    def _slurm_hosts(cls, data: object) -> object:
        if isinstance(data, dict):
            launcher = data.get("launcher", "ansible")
            if launcher == "slurm" and "slurm" not in data:
                raise ValueError(
                    "launcher: slurm needs a `slurm:` section (at least nodes and gpus_per_node)"
                )
            if launcher == "slurm" and "hosts" in data:
                raise ValueError(
                    "hosts: with launcher: slurm the hosts are the allocation's nodes; "
                    "leave `hosts:` out and set slurm.nodes and slurm.gpus_per_node"
                )
            for key in ("monitoring", "kv_pool"):
                if launcher == "slurm" and data.get(key) is not None:
                    raise ValueError(
                        f"{key}: is not run by launcher: slurm yet; leave it out, or use "
                        "launcher: ansible"
                    )
            if launcher != "slurm" and data.get("slurm") is not None:
                raise ValueError("slurm: is read only with launcher: slurm; set launcher: slurm")
        return stand_in_hosts(data)

    def host(self, name: str) -> Host:
        """The host called `name` (KeyError if none)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def router_host(self) -> str:
        """The router's host: the first replica's with `router.hosts`."""
        replicas = self.router.hosts
        return self.router.host or (replicas[0] if replicas else self.hosts[0].name)


ROLE_NAMES = ("prefill", "decode")
