"""A Plan as shell lines a person can read and paste, grouped by host."""

from __future__ import annotations

import shlex

from kit.plan.monitoring import prometheus_config
from kit.topology.plan_types import (
    Command,
    KvPoolProcess,
    MonitoringProcess,
    Plan,
    RouterProcess,
    WorkerProcess,
)


def command_lines(command: Command, env: dict[str, str], python: str = "python") -> list[str]:
    """One flag (with its values) per line, joined by backslash continuations."""
    head = " ".join(shlex.quote(a) for a in command.head(python))
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    lines = [f"{env_part} {head}" if env_part else head]
    lines += ["  " + " ".join(shlex.quote(a) for a in flag) for flag in command.flags]
    for flag, env_name in command.secret_args:
        lines.append(f'  {flag} "${env_name}"')
    return [line + " \\" for line in lines[:-1]] + [lines[-1]]


def _worker_comment(w: WorkerProcess) -> str:
    device = "CPU" if w.launch.device == "cpu" else "no GPU"
    parts = [f"GPUs {','.join(map(str, w.gpus))}" if w.gpus else device, f"HTTP :{w.http_port}"]
    if w.bootstrap_port is not None:
        parts.append(f"bootstrap :{w.bootstrap_port}")
    if w.nccl_port is not None:
        parts.append(f"nccl :{w.nccl_port}")
    if w.nnodes > 1:
        parts.append(f"node {w.node_rank} of {w.nnodes}, dist-init {w.dist_init_addr}")
    if w.rank_group_addr is not None:
        parts.append(f"under its rank group's agent (kit.ranks, leader {w.rank_group_addr})")
    return f"# {w.name} ({w.role}): {', '.join(parts)}"


def _router_comment(r: RouterProcess) -> str:
    extra = f", metrics :{r.metrics_port}" if r.metrics_port else ""
    key = ""
    if r.api_key_env or r.api_key_file:
        key = f", API key from {r.api_key_env or r.api_key_file}"
    return (
        f"# router ({r.kind}): :{r.port}{extra}, policies prefill={r.prefill_policy} "
        f"decode={r.decode_policy}{key}"
    )


def _monitoring_comment(m: MonitoringProcess) -> str:
    targets = sum(len(job.targets) for job in m.jobs)
    return (
        f"# prometheus (monitoring): :{m.port}, {targets} targets every "
        f"{m.scrape_interval_s:g} s, data in {m.data_dir} (kept {m.retention})"
    )


def _kv_pool_comment(k: KvPoolProcess) -> str:
    metadata = f"metadata :{k.metadata_port} (embedded)" if k.metadata_port else k.metadata_url
    return (
        f"# {k.name} (Mooncake Store master): RPC :{k.rpc_port}, metrics :{k.metrics_port}, "
        f"{metadata}; {len(k.clients)} clients over {k.protocol} give it "
        f"{k.capacity_bytes / (1 << 30):g} GiB; starts before the workers, stops after them"
    )


def plan_to_shell(plan: Plan) -> str:
    """Every process of the plan, per host, as paste-able shell."""
    out = [
        f"# pdkit plan '{plan.name}': engine {plan.engine}, SGLang {plan.sglang_version}, "
        f"model {plan.model.path}, transfer {plan.transfer_backend}"
    ]
    out += [f"# from `pdkit discover`'s facts: {field}" for field in plan.discovered]
    monitoring, pool = plan.monitoring, plan.kv_pool
    for host in plan.hosts:
        workers = plan.on_host(host.name)
        has_router = plan.router.host == host.name
        has_monitoring = monitoring is not None and monitoring.host == host.name
        has_pool = pool is not None and pool.host == host.name
        if not workers and not has_router and not has_monitoring and not has_pool:
            continue
        out += ["", f"## host {host.name} ({host.address})"]
        if pool is not None and has_pool:
            out += [_kv_pool_comment(pool), *command_lines(pool.command, pool.env)]
        for w in workers:
            python = w.python or "python"
            out += [_worker_comment(w), *command_lines(w.command, w.env, python)]
        if has_router:
            r = plan.router
            out += [_router_comment(r), *command_lines(r.command, r.env)]
        if monitoring is not None and has_monitoring:
            out += [_monitoring_comment(monitoring), *command_lines(monitoring.command, {})]
    if monitoring is not None:
        out += ["", f"## {monitoring.config_path} on {monitoring.host}"]
        out += prometheus_config(monitoring, plan.name).rstrip("\n").splitlines()
    return "\n".join(out) + "\n"
