"""Plan -> Ansible inventory: one host entry per topology host, with the layout of the
deployment on it and one record per process it runs. Pure: no I/O, no clock.

Secrets never enter the inventory. A process record names, in `secret_env`, the variable to
write into its environment file and the variable of the *ansible-playbook process* (on the
control machine) that holds the value; the playbook reads it with ``lookup('ansible.builtin.env')``
(`RouterProcess.api_key` reads it on the control machine).

Inventory groups: ``pdkit_hosts`` (every host of the deployment), ``pdkit_workers`` (hosts
running a worker), ``pdkit_router`` (the router's host) and ``pdkit_monitoring`` (Prometheus'
host, empty without `monitoring:`) and ``pdkit_kv_pool`` (the KV pool master's host, empty
without `kv_pool:`).

A record may carry `files` (path, content, mode: written with the process's own files, a change
restarts it) and `directories` (path, mode): Prometheus' configuration and data folder.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from kit.plan.monitoring import prometheus_config
from kit.topology.layout import HostLayout, service_name, unit_pattern
from kit.topology.plan_types import (
    Command,
    HostPlan,
    KvPoolProcess,
    MonitoringProcess,
    Plan,
    RouterProcess,
    WorkerProcess,
)

Stage = Literal["kv_pool", "workers", "router", "monitoring"]

CONTROL_ROUTER_KEY_ENV = "PDKIT_DEPLOY_ROUTER_API_KEY"
"""Variable of the ansible-playbook process that carries the router's client API key."""

CONTROL_ROUTER_ADMIN_KEY_ENV = "PDKIT_DEPLOY_ROUTER_ADMIN_KEY"
"""Variable of the ansible-playbook process that carries the router's admin key (pdkit's load
balancer: its /workers API, through which `pdkit up` changes the worker list live)."""

ROUTER_ADMIN_KEY_ENV = {"pdkit": "PDKIT_LB_ADMIN_KEY"}
"""Variable the router reads its admin key from, per router kind (smg 1.13's worker API takes
none unless control-plane keys are configured)."""

ROUTER_KEY_ENV = {"pdkit": "PDKIT_LB_API_KEY", "smg": "PDKIT_ROUTER_API_KEY"}
"""Variable the router reads its client API key from, per router kind (env file, 0600)."""

ROUTER_RELAUNCH_ENV = {"pdkit": "PDKIT_LB_RELAUNCH"}
"""Per router kind that hands its listening socket over on SIGUSR2 (`kit.lb.run`): the variable
that names what it execs, its launch script. Such a router restarts through that handover (the
playbook signals it) rather than a stop and a start, so no request is lost."""


@dataclass(frozen=True)
class DeployHost:
    """A host as the deployment layer sees it: the Plan's host plus resolved paths."""

    plan: HostPlan
    layout: HostLayout
    python: str
    """Interpreter that runs pdkit's processes on the host (`pdkit_python`)."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def local(self) -> bool:
        return self.plan.connection == "local"

    @property
    def become(self) -> bool:
        """Whether Ansible needs sudo: only over SSH as a non-root user writing system paths."""
        if self.plan.connection == "local" or self.plan.ssh_user == "root":
            return False
        return self.plan.service_manager == "systemd" or self.layout.root == "/"


def deploy_hosts(plan: Plan, control_python: str) -> tuple[DeployHost, ...]:
    """Every host of the plan with its layout; local hosts run `control_python` (the
    interpreter of the control machine's venv), remote ones the venv provisioning made."""
    hosts = []
    for host in plan.hosts:
        layout = HostLayout(deployment=plan.name, root=host.root)
        python = (
            control_python
            if host.connection == "local"
            else str(PurePosixPath(layout.venv_dir, "bin", "python"))
        )
        hosts.append(DeployHost(plan=host, layout=layout, python=python))
    return tuple(hosts)


def _process_record(
    process: WorkerProcess | RouterProcess | MonitoringProcess | KvPoolProcess,
    layout: HostLayout,
    command: Command,
) -> dict[str, Any]:
    """What every process record holds: its names and files (from the Plan and the host's
    layout; the playbooks format none of them) and its command."""
    return {
        "name": process.name,
        "unit": process.unit,
        "log_tag": service_name(layout.deployment, process.name),
        "env_file": layout.env_file(process.name),
        "launch_script": layout.launch_script(process.name),
        "program_conf": layout.program_conf(process.name),
        "log_file": process.log_path,
        "python": None,
        "module": command.module,
        "executable": command.executable,
        "args": list(command.args),
        "secret_args": [list(pair) for pair in command.secret_args],
        "files": [],
        "directories": [],
    }


def worker_record(
    worker: WorkerProcess, deployment: str, layout: HostLayout, hf_home: str | None = None
) -> dict[str, Any]:
    """The process record of a worker (what the pdkit_process role installs). `hf_home`, when
    given and the topology sets no HF_HOME, points SGLang at the provisioned weights."""
    env = {**worker.env, "PDKIT_DEPLOYMENT": deployment, "PDKIT_PROCESS": worker.name}
    if hf_home and "HF_HOME" not in env:
        env["HF_HOME"] = hf_home
    return {
        **_process_record(worker, layout, worker.command),
        "role": worker.role,
        "stage": "workers",
        # Node rank 0 stops first: ranks >= 1 ignore SIGTERM and exit after rank 0 does.
        "node_rank": worker.node_rank,
        # A rank of a multi-node instance runs under its group's agent (kit/ranks): the ranks
        # start together, rank 0 first, and all restart when one fails; none starts alone.
        "rank_group": rank_group_args(worker),
        "python": worker.python,
        "env": dict(sorted(env.items())),
        "secret_env": {},
        "url": worker.url if worker.serves_http else None,
        "input_files": [list(pair) for pair in worker.input_files],
    }


def rank_group_args(worker: WorkerProcess) -> list[str] | None:
    """`python -m kit.ranks` flags of a rank of a multi-node instance (None: one node)."""
    if worker.rank_group_addr is None:
        return None
    return [
        "--leader",
        worker.rank_group_addr,
        "--node-rank",
        str(worker.node_rank),
        "--nnodes",
        str(worker.nnodes),
    ]


def router_record(router: RouterProcess, deployment: str, layout: HostLayout) -> dict[str, Any]:
    """The process record of the router; its API key (if any) and its admin key arrive through
    `secret_env`. Its `restart_key` covers its settings but not its worker list: the playbook
    rewrites its launch script when workers change, and restarts it only when the key does
    (pdkit's router, `handover`: by SIGUSR2, on which it hands its socket to a new image)."""
    env = {**router.env, "PDKIT_DEPLOYMENT": deployment, "PDKIT_PROCESS": router.name}
    handover = router.kind in ROUTER_RELAUNCH_ENV
    if handover:
        env[ROUTER_RELAUNCH_ENV[router.kind]] = layout.launch_script(router.name)
    has_key = bool(router.api_key_env or router.api_key_file)
    secret_env = {ROUTER_KEY_ENV[router.kind]: CONTROL_ROUTER_KEY_ENV} if has_key else {}
    if router.kind in ROUTER_ADMIN_KEY_ENV:
        secret_env[ROUTER_ADMIN_KEY_ENV[router.kind]] = CONTROL_ROUTER_ADMIN_KEY_ENV
    command = router.command
    settings = [command.module, command.executable, router.settings_args, command.secret_args]
    return {
        **_process_record(router, layout, command),
        "role": "router",
        "stage": "router",
        "env": dict(sorted(env.items())),
        "secret_env": secret_env,
        "url": router.url,
        "restart_key": hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16],
        "handover": handover,
        # pdkit up: read the certificate files again (SIGHUP), no connection dropped.
        "reload_on_deploy": router.tls,
    }


def monitoring_record(
    monitoring: MonitoringProcess, deployment: str, layout: HostLayout
) -> dict[str, Any]:
    """The process record of Prometheus, with its configuration file and data folder."""
    env = {**monitoring.env, "PDKIT_DEPLOYMENT": deployment, "PDKIT_PROCESS": monitoring.name}
    config = prometheus_config(monitoring, deployment)
    return {
        **_process_record(monitoring, layout, monitoring.command),
        "role": "monitoring",
        "stage": "monitoring",
        "env": dict(sorted(env.items())),
        "secret_env": {},
        "url": monitoring.url,
        "files": [{"path": monitoring.config_path, "content": config, "mode": "0644"}],
        "directories": [{"path": monitoring.data_dir, "mode": "0755"}],
    }


def kv_pool_record(pool: KvPoolProcess, deployment: str, layout: HostLayout) -> dict[str, Any]:
    """The process record of the KV pool's master (Mooncake Store, `kv_pool:`)."""
    env = {**pool.env, "PDKIT_DEPLOYMENT": deployment, "PDKIT_PROCESS": pool.name}
    return {
        **_process_record(pool, layout, pool.command),
        "role": "kv_pool",
        "stage": "kv_pool",
        "env": dict(sorted(env.items())),
        "secret_env": {},
        "url": pool.url,
    }


def host_vars(host: DeployHost, plan: Plan) -> dict[str, Any]:
    """Everything one host's plays need: connection, layout, interpreter, processes."""
    hf_home = host.layout.hf_home if plan.engine == "sglang" else None
    records = []
    if plan.kv_pool is not None and plan.kv_pool.host == host.name:
        records.append(kv_pool_record(plan.kv_pool, plan.name, host.layout))
    records += [worker_record(w, plan.name, host.layout, hf_home) for w in plan.on_host(host.name)]
    if plan.runs_router(host.name):
        record = router_record(plan.router, plan.name, host.layout)
        if host.name != plan.router.host:
            # A replica past the first (router.hosts): `pdkit up` changes the workers through
            # the first one's API; this one takes a new worker list by a restart (no
            # restart_key), while the VIP stays on the first.
            del record["restart_key"]
            record["url"] = plan.router_url_on(host.name)
        records.append(record)
    if plan.monitoring is not None and plan.monitoring.host == host.name:
        records.append(monitoring_record(plan.monitoring, plan.name, host.layout))
    out: dict[str, Any] = {"ansible_host": host.plan.address}
    if host.local:
        # The control machine's own interpreter: no discovery, and it has pdkit installed.
        out |= {"ansible_connection": "local", "ansible_python_interpreter": host.python}
    else:
        out |= {
            "ansible_connection": "ssh",
            "ansible_user": host.plan.ssh_user,
            "ansible_port": host.plan.ssh_port,
            "ansible_python_interpreter": "auto_silent",
        }
        if host.plan.ssh_key:
            out["ansible_ssh_private_key_file"] = host.plan.ssh_key
    out["ansible_become"] = host.become
    out |= {
        "pdkit_root": host.layout.root,
        "pdkit_python": host.python,
        "pdkit_service_manager": host.plan.service_manager,
        **host.layout.ansible_vars(),
        "pdkit_unit_pattern": unit_pattern(plan.name),
        "pdkit_processes": records,
    }
    vip = plan.router_vip
    for replica in vip.replicas if vip else ():
        if replica.host == host.name:  # provisioning's pdkit_keepalived writes it as it is
            out["pdkit_keepalived_config"] = {
                "path": replica.config_path,
                "content": replica.config,
                "run_dir": replica.run_dir,
            }
    return out


def build_inventory(plan: Plan, hosts: tuple[DeployHost, ...]) -> dict[str, Any]:
    """The inventory (YAML/JSON inventory structure) of a plan."""
    worker_hosts = {w.host for w in plan.workers}
    return {
        "all": {
            "vars": {"pdkit_deployment": plan.name, "pdkit_engine": plan.engine},
            "children": {
                "pdkit_hosts": {"hosts": {h.name: host_vars(h, plan) for h in hosts}},
                "pdkit_workers": {"hosts": {h.name: {} for h in hosts if h.name in worker_hosts}},
                "pdkit_router": {"hosts": {name: {} for name in plan.router_replicas}},
                "pdkit_router_vip": {
                    "hosts": {r.host: {} for r in plan.router_vip.replicas}
                    if plan.router_vip
                    else {}
                },
                "pdkit_monitoring": {
                    "hosts": {plan.monitoring.host: {}} if plan.monitoring else {}
                },
                "pdkit_kv_pool": {"hosts": {plan.kv_pool.host: {}} if plan.kv_pool else {}},
            },
        }
    }
