"""The Plan's types: the single resolved record of a deployment, one entry per OS process.

`kit/plan` builds it (`kit.plan.resolve.resolve`); its types live here, in the topology floor
below kit/plan, because the layers kit/plan asks for argv (kit/sglang, kit/lb) and every later
stage (deploy, probes, bench) read them. None re-derives a port, a GPU or an address.
`pdkit render --json` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from kit.net import http_url
from kit.secrets import SecretSource, read_secret
from kit.topology.args import Flag, flatten
from kit.topology.launch import Parallelism, WorkerLaunch
from kit.topology.schema import SLO, Device, Engine, RouterKind, ServiceManager, TransferBackend
from kit.topology.slurm_schema import Slurm

Role = Literal["prefill", "decode"]


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Packages(Frozen):
    """What an SGLang version's wheel pins that a GPU host must match (its METADATA's
    Requires-Dist), as its dialect (`kit.sglang.dialects`) says; provisioning reads it from the
    Plan. `min_driver_branch` is the NVIDIA driver branch its torch's CUDA needs;
    `mooncake_package` the Mooncake build for that CUDA."""

    torch: str
    cuda: str
    sglang_kernel: str
    flashinfer: str
    deep_gemm: str
    mooncake_package: str
    mooncake_version: str
    min_driver_branch: int
    python: str = ">=3.11"

    def as_dict(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.model_dump().items()}


class Command(Frozen):
    """What a process runs: `python -m MODULE ARGS` or `EXECUTABLE ARGS`.

    `flags` are its arguments as rendered, each flag with its values (`args` is them in a row):
    the shell view and `pdkit up`'s diff read them, never the argv split again. `secret_args`
    are (flag, ENV_NAME) pairs appended at launch as `flag "$ENV_NAME"`, so that a secret lives
    only in the process's environment file, never in the Plan or a rendered line.
    """

    module: str | None = None
    executable: str | None = None
    flags: tuple[Flag, ...] = Field(exclude=True)
    secret_args: tuple[tuple[str, str], ...] = ()

    @computed_field  # type: ignore[prop-decorator]  # shown in `pdkit render --json`
    @property
    def args(self) -> tuple[str, ...]:
        """The arguments after the module or executable."""
        return flatten(self.flags)

    def head(self, python: str = "python") -> list[str]:
        """What comes before the arguments: `python -m MODULE`, or the executable."""
        return [python, "-m", self.module] if self.module else [self.executable or ""]

    def argv(self, python: str = "python") -> list[str]:
        """The argv without secrets; `python` is the interpreter that runs a module."""
        return [*self.head(python), *self.args]


class HostPlan(Frozen):
    """A host as the deployment sees it."""

    name: str
    address: str = Field(description="Bare address (an IPv6 literal without brackets).")
    connection: Literal["ssh", "local"]
    ssh_user: str
    ssh_port: int
    ssh_key: str | None
    device: Device = Field("cuda", description="cuda (GPUs) or cpu (no GPU).")
    gpus: int
    gpu_type: str | None
    service_manager: ServiceManager
    root: str = Field(description="Absolute root prefix on the host (POSIX path).")
    rdma_devices: tuple[str, ...] = Field(description="RDMA devices the topology lists.")
    sglang_python: str | None = Field(
        None,
        description="Interpreter of engine sglang's workers on the host (absolute), or None: "
        "the one pdkit's processes run with.",
    )


class PortUse(Frozen):
    """A port (or range) a process listens on, and who must reach it: the firewall rule."""

    first: int
    last: int = Field(description="Last port of the range (= first for one port).")
    what: str = Field(description="What listens there, e.g. HTTP, bootstrap, DP handshake.")
    reached_by: str = Field(
        description="Who connects: clients (router, Prometheus, pdkit), decode hosts, the "
        "instance's nodes, peer hosts (the other role's), or this host only (local)."
    )

    @property
    def ports(self) -> range:
        return range(self.first, self.last + 1)


class WorkerProcess(Frozen):
    """One SGLang (or sim) server process: an instance, or one node of a multi-node instance."""

    name: str = Field(description="Unique in the deployment, e.g. prefill-0 or decode-1-node1.")
    instance_name: str = Field(description="The instance this process belongs to: prefill-0.")
    role: Role
    instance: int = Field(description="Instance index within its role.")
    node_rank: int
    nnodes: int
    host: str
    address: str = Field(description="The host's bare address (reachable by other hosts).")
    bind: str = Field(description="Address the HTTP (and bootstrap) server binds.")
    gpus: tuple[int, ...] = Field(description="GPU indices on the host this process uses.")
    launch: WorkerLaunch = Field(
        description="The instance's launch values (parallelism, GPU, memory and batching) as "
        "the topology sets them: what kit.perf models the instance by."
    )
    http_port: int
    bootstrap_port: int | None = Field(description="Prefill only (on every node of it).")
    ports: tuple[PortUse, ...] = Field(
        (),
        description="Every port the process listens on, those SGLang derives without a flag "
        "included (the dist-init block, DP attention's ZMQ ports, the DP handshake, Mooncake's "
        "RPC range).",
    )
    dist_init_addr: str | None = Field(
        description="host:port of rank 0: multi-node or DP-attention instances only."
    )
    rank_group_addr: str | None = Field(
        None,
        description="host:port of the instance's rank group leader (pdkit's agent beside node "
        "rank 0, kit/ranks): multi-node instances only. Every rank runs under its agent, which "
        "stops and starts all ranks together when one fails.",
    )
    nccl_port: int | None = Field(
        None, description="--nccl-port (torch.distributed's port), planned with the others."
    )
    rdma_devices: tuple[str, ...] = Field(
        description="RDMA devices the transfer engine of this process uses (none: no RDMA)."
    )
    gpu_nics: dict[int, str] = Field(
        description="GPU index -> RDMA device, when the devices are mapped per GPU."
    )
    ib_device: str | None = Field(description="Rendered --disaggregation-ib-device value.")
    gid_index: int | None = Field(description="RoCE GID index (MC_GID_INDEX), if set.")
    unit: str = Field(description="systemd unit name (systemd hosts).")
    log_path: str = Field(description="Log file on the host (absolute).")
    command: Command
    env: dict[str, str]
    input_files: tuple[tuple[str, str], ...] = Field(
        (),
        description="(flag, absolute path) of the files the flags name (--init-expert-location, "
        "--deepep-config, ...): `pdkit up` checks each exists on the host before starting.",
    )
    python: str | None = Field(
        None,
        description="Interpreter that runs `command` (the host's sglang_python for engine "
        "sglang), or None: the one pdkit's processes run with on the host.",
    )

    @computed_field  # type: ignore[prop-decorator]  # shown in `pdkit render --json` too
    @property
    def parallelism(self) -> Parallelism:
        """How the instance spreads over GPUs (its launch record's)."""
        return self.launch.parallelism

    @property
    def url(self) -> str:
        """HTTP base URL the control machine and the router use."""
        return http_url(self.address, self.http_port)

    @property
    def serves_http(self) -> bool:
        """Only node rank 0 of an instance serves its API (the other nodes of a multi-node
        instance serve /health and /metrics on their port, as SGLang 0.5.23's do)."""
        return self.node_rank == 0


class RouterProcess(Frozen):
    """The load balancer."""

    name: str
    kind: RouterKind
    host: str
    address: str
    bind: str
    port: int
    metrics_port: int | None = Field(description="Separate Prometheus port (smg), else None.")
    prefill_policy: str
    decode_policy: str
    api_key_env: str | None = Field(
        description="Control-machine env var holding the client API key (copied at deploy)."
    )
    api_key_file: str | None = Field(
        description="Control-machine file holding the client API key (absolute)."
    )
    unit: str = Field(description="systemd unit name (systemd hosts).")
    log_path: str = Field(description="Log file on the host (absolute).")
    command: Command = Field(
        description="What the router runs: its args are `worker_args` and `settings_args` "
        "composed (smg: `launch --pd-disaggregation`, the workers, then the rest)."
    )
    worker_args: tuple[str, ...] = Field(
        description="The flags that list the workers: `pdkit up` changes them through the "
        "router's worker API, not by restarting the router."
    )
    settings: tuple[Flag, ...] = Field(
        exclude=True,
        description="The router's own settings (command.flags without the workers'): a change "
        "restarts it.",
    )
    env: dict[str, str]
    hold_timeout_s: float = Field(
        0.0,
        description="Seconds the router holds a request while a role has no serving worker "
        "(pdkit: router.faults.hold_timeout_s; smg holds none: 0).",
    )
    tls: bool = Field(
        False,
        description="TLS on the client port (router.tls): its URL is https, and `pdkit up` "
        "makes it read its certificate files again (SIGHUP).",
    )
    tokenizer_path: str | None = Field(
        None,
        description="pdkit: the folder the router loads the served model's tokenizer from "
        "(--prompt-tokens model:PATH), else None; provisioning puts the tokenizer files there "
        "on the router's host when no worker of that host has the weights.",
    )

    @computed_field  # type: ignore[prop-decorator]  # shown in `pdkit render --json`
    @property
    def settings_args(self) -> tuple[str, ...]:
        """`settings` in a row (command.args without worker_args)."""
        return flatten(self.settings)

    @property
    def url(self) -> str:
        return http_url(self.address, self.port, tls=self.tls)

    @property
    def metrics_url(self) -> str:
        """Prometheus endpoint: smg's separate port, else /metrics on the router's port."""
        if self.metrics_port:
            return http_url(self.address, self.metrics_port, "/metrics")
        return http_url(self.address, self.port, "/metrics", tls=self.tls)

    @property
    def api_key_source(self) -> SecretSource | None:
        """Where clients' API key is kept on the control machine, or None (no key)."""
        if self.api_key_file:
            return SecretSource("router.api_key_file", file=self.api_key_file)
        if self.api_key_env:
            return SecretSource("router.api_key_env", env=self.api_key_env)
        return None

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The clients' API key read on the control machine (`SecretError` when the topology
        names one that cannot be read), or None when the router takes no key."""
        source = self.api_key_source
        return read_secret(source, environ) if source else None


class ScrapeTarget(Frozen):
    """One endpoint Prometheus scrapes, with the labels pdkit gives its series."""

    address: str = Field(description="host:port (IPv6 in brackets).")
    labels: dict[str, str] = Field(
        description="deployment, process, role, host (`instance` stays Prometheus' own)."
    )


class ScrapeJob(Frozen):
    """Targets that share a metrics path and a `job` label (router, prefill, decode, ...)."""

    job: str
    metrics_path: str
    targets: tuple[ScrapeTarget, ...]


class MonitoringProcess(Frozen):
    """Prometheus, scraping the deployment (topology `monitoring:`)."""

    name: str
    host: str
    address: str
    bind: str
    port: int
    scrape_interval_s: float
    retention: str
    config_path: str = Field(description="Its configuration file on the host (absolute).")
    data_dir: str = Field(description="Its TSDB folder on the host (kept by `pdkit down`).")
    jobs: tuple[ScrapeJob, ...]
    unit: str = Field(description="systemd unit name (systemd hosts).")
    log_path: str = Field(description="Log file on the host (absolute).")
    command: Command
    env: dict[str, str]

    @property
    def url(self) -> str:
        """Prometheus' HTTP base URL (the UI and /api/v1)."""
        return http_url(self.address, self.port)


class KvPoolProcess(Frozen):
    """The KV cache pool's master (Mooncake Store, topology `kv_pool:`), with its HTTP
    metadata server embedded unless the topology names one elsewhere."""

    name: str
    host: str
    address: str
    bind: str
    rpc_port: int
    metrics_port: int = Field(description="HTTP port of /metrics and /health.")
    metadata_port: int | None = Field(
        description="Port of the embedded HTTP metadata server (None: one elsewhere)."
    )
    master_address: str = Field(description="host:port clients reach the master at.")
    metadata_url: str = Field(description="The metadata server clients use.")
    protocol: str = Field(description="tcp or rdma (MOONCAKE_PROTOCOL of the clients).")
    page_size: int = Field(description="Tokens per KV page the workers store.")
    clients: tuple[str, ...] = Field(description="Processes that use the pool.")
    capacity_bytes: int = Field(description="DRAM the clients give the pool, all together.")
    unit: str = Field(description="systemd unit name (systemd hosts).")
    log_path: str = Field(description="Log file on the host (absolute).")
    command: Command
    env: dict[str, str]

    @property
    def url(self) -> str:
        """The master's HTTP base URL (/health, /metrics)."""
        return http_url(self.address, self.metrics_port)


class ModelPlan(Frozen):
    path: str
    served_name: str
    revision: str | None
    trust_remote_code: bool


class KeepalivedReplica(Frozen):
    """keepalived on one router host (`router.vip`): its VRRP priority and its whole
    configuration file, rendered here (the playbook writes it as it is)."""

    host: str
    address: str = Field(description="The host's own address (its unicast VRRP source).")
    priority: int = Field(description="VRRP priority: the highest healthy host holds the VIP.")
    config_path: str = Field(description="keepalived.conf on the host (absolute).")
    config: str = Field(description="The file's whole text.")
    run_dir: str = Field(
        description="Where keepalived started without systemd keeps its pid files (absolute)."
    )


class RouterVipPlan(Frozen):
    """The router's virtual IP, held by keepalived on one of `replicas` at a time."""

    address: str = Field(description="The VIP with its prefix length (e.g. 10.0.0.100/24).")
    interface: str
    virtual_router_id: int
    replicas: tuple[KeepalivedReplica, ...]

    @property
    def ip(self) -> str:
        """The VIP without its prefix length, as clients dial it."""
        return self.address.split("/", 1)[0]


class Plan(Frozen):
    """Everything resolved: hosts, worker processes in start order, the router."""

    name: str
    engine: Engine
    sglang_version: str
    model: ModelPlan
    transfer_backend: TransferBackend
    hosts: tuple[HostPlan, ...]
    workers: tuple[WorkerProcess, ...]
    router: RouterProcess
    slo: SLO
    readiness_timeout_s: float | None = Field(
        None,
        description="Seconds `pdkit up` waits for the workers (cluster.readiness_timeout_s or "
        "its profile's); None: the engine's default.",
    )
    monitoring: MonitoringProcess | None = None
    kv_pool: KvPoolProcess | None = None
    router_hosts: tuple[str, ...] = Field(
        (), description="Hosts that run a router replica (router.hosts); empty: one router."
    )
    router_vip: RouterVipPlan | None = None
    packages: Packages | None = Field(
        None, description="What provisioning installs for the pinned SGLang (its dialect's)."
    )
    discovered: tuple[str, ...] = Field(
        (),
        description="The fields `pdkit discover`'s facts filled in where the topology leaves "
        "them out (`hosts[a].network_interface: eth0`).",
    )
    slurm: Slurm | None = Field(
        None,
        description="launcher: slurm: the allocation and the nodes' environment (root and venv "
        "absolute); None: launcher ansible.",
    )

    def role(self, role: Role) -> tuple[WorkerProcess, ...]:
        """Rank-0 processes of a role, one per instance (the ones that serve HTTP)."""
        return tuple(w for w in self.workers if w.role == role and w.serves_http)

    def router_url_on(self, host: str) -> str:
        """The router's URL on `host`, one of its replicas (router.hosts)."""
        if host == self.router.host:
            return self.router.url
        return http_url(self.host(host).address, self.router.port, tls=self.router.tls)

    def runs_router(self, host: str) -> bool:
        """Whether `host` runs the router, or one of its replicas (router.hosts)."""
        return host in self.router_replicas

    @property
    def router_replicas(self) -> tuple[str, ...]:
        """The hosts that run the router: router.hosts, else the router's one host."""
        return self.router_hosts or (self.router.host,)

    @property
    def vip_url(self) -> str | None:
        """The router's URL at its virtual IP (router.vip: what clients use), else None."""
        vip = self.router_vip
        return http_url(vip.ip, self.router.port, tls=self.router.tls) if vip else None

    @property
    def client_url(self) -> str:
        """What clients use: the VIP's URL (router.vip), else the router's."""
        return self.vip_url or self.router.url

    def on_host(self, host: str) -> tuple[WorkerProcess, ...]:
        return tuple(w for w in self.workers if w.host == host)

    def host(self, name: str) -> HostPlan:
        """The host called `name` (KeyError if none)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def process_names(self) -> tuple[str, ...]:
        """Every process: the KV pool's master (if any), workers in start order, the router,
        then Prometheus (if any)."""
        extra = (self.monitoring.name,) if self.monitoring else ()
        pool = (self.kv_pool.name,) if self.kv_pool else ()
        return (*pool, *(w.name for w in self.workers), self.router.name, *extra)

    def process(
        self, name: str
    ) -> WorkerProcess | RouterProcess | MonitoringProcess | KvPoolProcess:
        """The process called `name` (KeyError if none)."""
        if name == self.router.name:
            return self.router
        if self.kv_pool is not None and name == self.kv_pool.name:
            return self.kv_pool
        if self.monitoring is not None and name == self.monitoring.name:
            return self.monitoring
        for worker in self.workers:
            if worker.name == name:
                return worker
        raise KeyError(name)
