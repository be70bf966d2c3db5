"""The Plan: the single resolved record of a deployment, one entry per OS process.

Every later stage (render, deploy, probes, bench) reads the Plan; none re-derives a port, a GPU
or an address. `pdkit render --json` prints it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kit.topology.schema import SLO, Engine, RouterKind, ServiceManager, TransferBackend

Role = Literal["prefill", "decode"]


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Command(Frozen):
    """What a process runs: `python -m MODULE ARGS` or `EXECUTABLE ARGS`.

    `secret_args` are (flag, ENV_NAME) pairs appended at launch as `flag "$ENV_NAME"`, so that a
    secret lives only in the process's environment file, never in the Plan or a rendered line.
    """

    module: str | None = None
    executable: str | None = None
    args: tuple[str, ...]
    secret_args: tuple[tuple[str, str], ...] = ()

    def argv(self, python: str = "python") -> list[str]:
        """The argv without secrets; `python` is the interpreter that runs a module."""
        head = [python, "-m", self.module] if self.module else [self.executable or ""]
        return [*head, *self.args]


class HostPlan(Frozen):
    """A host as the deployment sees it."""

    name: str
    address: str
    connection: Literal["ssh", "local"]
    ssh_user: str
    ssh_port: int
    ssh_key: str | None
    gpus: int
    gpu_type: str | None
    service_manager: ServiceManager
    root: str


class WorkerProcess(Frozen):
    """One SGLang (or sim) server process: an instance, or one node of a multi-node instance."""

    name: str = Field(description="Unique in the deployment, e.g. prefill-0 or decode-1-node1.")
    role: Role
    instance: int = Field(description="Instance index within its role.")
    node_rank: int
    nnodes: int
    host: str
    address: str = Field(description="The host's address (reachable by other hosts).")
    bind: str = Field(description="Address the HTTP (and bootstrap) server binds.")
    gpus: tuple[int, ...] = Field(description="GPU indices on the host this process uses.")
    http_port: int
    bootstrap_port: int | None = Field(description="Prefill only (on every node of it).")
    dist_init_addr: str | None = Field(description="host:port of rank 0, multi-node only.")
    ib_device: str | None = Field(description="Rendered --disaggregation-ib-device value.")
    command: Command
    env: dict[str, str]

    @property
    def url(self) -> str:
        """HTTP base URL the control machine and the router use."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.http_port}"

    @property
    def serves_http(self) -> bool:
        """Only node rank 0 of an instance answers HTTP requests."""
        return self.node_rank == 0


class RouterProcess(Frozen):
    """The load balancer."""

    name: str = "router"
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
    api_key_file: str | None
    command: Command
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Prometheus endpoint: smg's separate port, else /metrics on the router's port."""
        if self.metrics_port is None:
            return f"{self.url}/metrics"
        return f"http://{self._host}:{self.metrics_port}/metrics"

    @property
    def _host(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address


class ModelPlan(Frozen):
    path: str
    served_name: str
    revision: str | None
    trust_remote_code: bool


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

    def role(self, role: Role) -> tuple[WorkerProcess, ...]:
        """Rank-0 processes of a role, one per instance (the ones that serve HTTP)."""
        return tuple(w for w in self.workers if w.role == role and w.serves_http)

    def on_host(self, host: str) -> tuple[WorkerProcess, ...]:
        return tuple(w for w in self.workers if w.host == host)
