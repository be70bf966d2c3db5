"""The steps that `pdkit up` (first run or live change) and `pdkit restart` share: their options
and timeouts, a playbook run and a readiness wait as the user sees them, the failure report,
Prometheus, and the end of every rollout (`finish_rollout`: the router's /readiness, Prometheus,
the KV transfer gate, then what serves and how to reach it). The deployment lock they take (with
`pdkit provision`) is `kit.hosts.context.deployment_lock`.

`kit.deploy.rollout` (first run, down) and `kit.deploy.live` (changes to a running deployment)
sit above this module; it imports neither.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from kit.deploy.gate import transfer_gate
from kit.deploy.routing import admin_key
from kit.deploy.services import host_processes
from kit.deploy.view import ReadinessView, status_table
from kit.deploy.wait import (
    ProcessStatus,
    Target,
    kv_pool_targets,
    monitoring_targets,
    router_targets,
    vip_targets,
    wait_ready,
)
from kit.errors import DeployError, PdkitError, ProbeError
from kit.hosts.context import DeployContext
from kit.hosts.inventory import CONTROL_ROUTER_ADMIN_KEY_ENV, CONTROL_ROUTER_KEY_ENV
from kit.hosts.logs import tail
from kit.hosts.playbook import PlaybookResult, failure_report, run_playbook
from kit.hosts.progress import AnsibleView
from kit.hosts.reach import check_reach, failure_lines
from kit.hosts.state_dir import display_path
from kit.observe.doctor import DoctorOptions
from kit.observe.prometheus import ScrapeHealth, wait_scraped
from kit.observe.signatures import diagnose
from kit.secrets import SecretError

WORKER_TIMEOUT_S = {"sim": 120.0, "sglang": 1800.0}
"""Default seconds for every worker to become ready, by engine (SGLang loads real weights)."""
ROUTER_TIMEOUT_S = 60.0
MONITORING_TIMEOUT_S = 60.0
KV_POOL_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
"""Default seconds an instance leaving the router may take to finish its requests."""
LOG_TAIL_LINES = 25


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    """How `pdkit up` and `pdkit restart` run (their command-line options)."""

    worker_timeout: float | None = None
    """Seconds for the workers to become ready (None: `WORKER_TIMEOUT_S` of the engine)."""
    router_timeout: float | None = None
    """Seconds for the router to become ready (None: `ROUTER_TIMEOUT_S`)."""
    verbose: bool = False
    gate: bool = True
    """Run the KV transfer gate last (kit.deploy.gate); `pdkit up --no-gate`: False."""
    gate_options: DoctorOptions = field(default_factory=DoctorOptions)
    parallel: int = 1
    """Instances replaced (or added, removed) at a time in a live change (`--parallel`)."""
    drain_timeout: float | None = None
    """Seconds an instance leaving the router may take to finish its requests (None: 60)."""
    diff_only: bool = False
    """`pdkit up --diff`: print what would change, change nothing."""
    force: bool = False
    """`--force`: replace a role's only instance even when no GPU is free for a stand-in and
    it would be out longer than the router's hold (kit.deploy.surge)."""


def play(
    ctx: DeployContext,
    console: Console,
    playbook: str,
    *,
    tags: str | None,
    secret_env: dict[str, str],
    verbose: bool,
    inventory: dict[str, Any] | None = None,
) -> PlaybookResult:
    """Run `playbook` over the deployment's inventory (or `inventory`, the same with extra
    host variables); a failed run raises `DeployError` with what still runs."""
    with AnsibleView(console) as view:
        result = run_playbook(
            ctx.private_dir,
            inventory if inventory is not None else ctx.inventory(),
            playbook,
            tags=tags,
            secret_env=secret_env,
            listener=view.listener,
            verbose=verbose,
        )
    if not result.ok:
        raise DeployError(f"{failure_report(result)}\n{_running_now(ctx)}")
    return result


def reach_preflight(ctx: DeployContext, console: Console) -> None:
    """Before any worker starts: every port a host must reach on another host (a prefill's
    bootstrap port from each decode host, a dist-init port from its instance's other nodes) is
    reached (`kit.hosts.reach`); else `DeployError` naming each route and what to open."""
    results = check_reach(ctx.plan, ctx.hosts_by_name)
    if not results:
        return
    failed = [r for r in results if not r.ok]
    console.print(
        f"[bold]Preflight[/]: {len(results) - len(failed)} of {len(results)} port(s) a host "
        "must reach on another host reached"
    )
    if not failed:
        return
    topology = shlex.quote(str(ctx.topology_file))
    raise DeployError(
        "\n".join(
            [
                f"The reachability preflight failed: {len(failed)} of {len(results)} route(s) "
                "between hosts do not connect.",
                *failure_lines(results),
                "Nothing was started.",
                f"To fix: open the ports above, then `pdkit up {topology}` again; `pdkit "
                f"provision {topology} --check` runs the same check with the rest of the hosts' "
                "checklist.",
            ]
        )
    )


def wait_until_ready(
    ctx: DeployContext,
    console: Console,
    targets: list[Target],
    timeout: float,
    headers: dict[str, str] | None,
) -> list[ProcessStatus]:
    """Wait up to `timeout` seconds for `targets` to become ready, with the readiness view
    live; returns each one's last status (the caller decides what a failure means)."""
    since = time.time()
    with ReadinessView(console) as view:
        return asyncio.run(
            wait_ready(
                targets,
                ctx.hosts_by_name,
                timeout=timeout,
                since=since,
                headers=headers,
                on_update=view.update,
            )
        )


def playbook_secret_env(ctx: DeployContext) -> dict[str, str]:
    """What the playbooks write into the router's environment file: its client key (read on
    this machine) and the deployment's admin key for its worker API."""
    try:
        key = ctx.plan.router.api_key(os.environ)
    except SecretError as exc:
        raise DeployError(f"{exc} Nothing was deployed.") from exc
    secret_env = {CONTROL_ROUTER_KEY_ENV: key} if key else {}
    admin = router_key(ctx)
    if admin:
        secret_env[CONTROL_ROUTER_ADMIN_KEY_ENV] = admin
    return secret_env


def router_key(ctx: DeployContext) -> str | None:
    """The key of the router's worker API: the deployment's admin key (pdkit's router)."""
    return admin_key(ctx.state_dir) if ctx.plan.router.kind == "pdkit" else None


def raise_unless_ready(ctx: DeployContext, statuses: list[ProcessStatus], stage: str) -> None:
    """Raise `DeployError` unless every status is ready: what failed with its log tail, what
    still runs, and what `stage` (workers, joining, router, monitoring, serving) leaves."""
    settled = [s for s in statuses if s.verdict.state in ("failed", "timeout")]
    if not settled and all(s.verdict.state == "ready" for s in statuses):
        return
    lines = []
    for status in settled:
        target = status.target
        lines.append(
            f"{target.name} on {target.host} {_state_phrase(status)}: {status.verdict.detail}."
        )
        lines += _log_tail(ctx, target.process_name)
    unsettled = [s for s in statuses if s.verdict.state in ("waiting", "starting")]
    if unsettled:
        lines.append(
            "Not ready yet when pdkit stopped waiting: "
            + ", ".join(f"{s.target.name} ({s.verdict.state})" for s in unsettled)
            + "."
        )
    if stage == "kv_pool":
        lines.append("No worker or router was started by this run.")
    if stage == "workers":
        lines.append("The router was not started by this run.")
    if stage == "joining":
        lines.append("It was not added to the router; everything else serves as before.")
    if stage == "monitoring":
        lines.append("The workers and the router serve; only Prometheus failed.")
    lines.append(_running_now(ctx))
    topology = shlex.quote(str(ctx.topology_file))
    name = shlex.quote((settled or unsettled)[0].target.name)
    lines.append(
        f"To fix: correct the cause above, then run `pdkit up {topology}` again (it restarts "
        f"only what changed). `pdkit logs {topology} {name}` shows the whole log; "
        f"`pdkit down {topology}` stops everything."
    )
    raise DeployError("\n".join(lines))


def _state_phrase(status: ProcessStatus) -> str:
    return {
        "failed": "failed",
        "timeout": "did not become ready in time",
    }.get(status.verdict.state, f"is still {status.verdict.state}")


def _log_tail(ctx: DeployContext, process: str) -> list[str]:
    log = ctx.log_file(process)
    try:
        lines = tail(log, LOG_TAIL_LINES)
    except PdkitError as exc:
        return [f"  (its log {log.path} on {log.host.name} could not be read: {exc})"]
    if not lines:
        return [f"  (its log {display_path(log.path)} is empty)"]
    head = f"  Last {len(lines)} lines of {display_path(log.path)}:"
    # A known line (an NCCL watchdog, an unreachable dist-init port, ...) names its cause.
    causes = [
        f"  cause ({m.signature.name}): {m.signature.cause}. To fix: {m.signature.fix}."
        for m in diagnose((process, line) for line in lines)[:1]
    ]
    return [head, *(f"  | {line}" for line in lines), *causes]


def _running_now(ctx: DeployContext) -> str:
    """What the service managers pdkit can ask say is running (local supervisord hosts)."""
    running: list[str] = []
    unknown: list[str] = []
    for host in ctx.hosts:
        view = host_processes(host)
        if view is None:
            if not host.local or host.plan.service_manager != "supervisord":
                unknown.append(host.name)
            continue
        running += [
            f"{name} (pid {info.pid})" if info.pid else f"{name} (exited; supervisord retries it)"
            for name, info in sorted(view.items())
            if info.state in ("RUNNING", "STARTING", "BACKOFF")
        ]
    text = f"Still running: {', '.join(running)}." if running else "Nothing of it is running."
    if unknown:
        text += f" (Not known for {', '.join(unknown)}: see `pdkit status`.)"
    return text


def deploy_kv_pool(
    ctx: DeployContext, console: Console, secret_env: dict[str, str], verbose: bool
) -> list[ProcessStatus]:
    """Deploy the KV pool's master (topology `kv_pool:`) and wait for its /health; nothing
    without. It runs before the workers, whose store clients connect to it at start."""
    pool = ctx.plan.kv_pool
    if pool is None:
        return []
    console.print(
        f"[bold]KV pool[/]: installing and starting the Mooncake Store master on {pool.host} "
        "(Ansible, deploy.yml --tags kv_pool)"
    )
    result = play(
        ctx, console, "deploy.yml", tags="kv_pool", secret_env=secret_env, verbose=verbose
    )
    console.print(f"  {result.progress.summary()}", style="dim", markup=False)
    console.print(f"[bold]KV pool[/]: waiting for /health (timeout {KV_POOL_TIMEOUT_S:.0f} s)")
    status = wait_until_ready(ctx, console, kv_pool_targets(ctx.plan), KV_POOL_TIMEOUT_S, None)
    raise_unless_ready(ctx, status, stage="kv_pool")
    return status


def deploy_monitoring(
    ctx: DeployContext, console: Console, secret_env: dict[str, str], verbose: bool
) -> list[ProcessStatus]:
    """Deploy Prometheus (topology `monitoring:`) and wait until it is ready; nothing without."""
    monitoring = ctx.plan.monitoring
    if monitoring is None:
        return []
    console.print(
        f"[bold]Prometheus[/]: installing and starting on {monitoring.host} "
        "(Ansible, deploy.yml --tags monitoring)"
    )
    result = play(
        ctx, console, "deploy.yml", tags="monitoring", secret_env=secret_env, verbose=verbose
    )
    console.print(f"  {result.progress.summary()}", style="dim", markup=False)
    console.print(
        f"[bold]Prometheus[/]: waiting for /-/ready (timeout {MONITORING_TIMEOUT_S:.0f} s)"
    )
    targets = monitoring_targets(ctx.plan)
    status = wait_until_ready(ctx, console, targets, MONITORING_TIMEOUT_S, None)
    raise_unless_ready(ctx, status, stage="monitoring")
    return status


def finish_rollout(
    ctx: DeployContext,
    console: Console,
    options: UpOptions,
    secret_env: dict[str, str],
    worker_statuses: list[ProcessStatus],
    *,
    monitoring: bool,
    gate: bool,
) -> None:
    """The end of every rollout: wait for the router's /readiness (raising unless it is ready),
    deploy Prometheus when `monitoring` (and the topology has it), run the KV transfer gate when
    `gate`, then print what serves (`worker_statuses` first) and how to reach it."""
    router_timeout = options.router_timeout or ROUTER_TIMEOUT_S
    key = secret_env.get(CONTROL_ROUTER_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    console.print(f"[bold]Router[/]: waiting for /readiness (timeout {router_timeout:.0f} s)")
    targets = router_targets(ctx.plan)
    router_status = wait_until_ready(ctx, console, targets, router_timeout, headers)
    raise_unless_ready(ctx, router_status, stage="router")
    vip = vip_targets(ctx.plan)
    if vip:  # keepalived gives it to a replica once its health check passes (rise 2)
        console.print(f"[bold]Router[/]: waiting for its VIP {escape(vip[0].url or '')}")
        router_status += wait_until_ready(ctx, console, vip, router_timeout, headers)
        raise_unless_ready(ctx, router_status, stage="router")
    monitoring_status = (
        deploy_monitoring(ctx, console, secret_env, options.verbose) if monitoring else []
    )
    if gate:
        transfer_gate(ctx, console, options.gate_options)
    _print_serving(ctx, console, worker_statuses + router_status + monitoring_status)


def _print_serving(ctx: DeployContext, console: Console, statuses: list[ProcessStatus]) -> None:
    plan = ctx.plan
    pids: dict[tuple[str, str], int | None] = {}
    for host in ctx.hosts:
        pids |= {(host.name, name): i.pid for name, i in (host_processes(host) or {}).items()}
    rows = [
        (
            s.target.name,
            s.target.role,
            s.target.host,
            (s.target.url or "-").removeprefix("http://"),
            s.verdict.state,
            str(pids.get((s.target.host, s.target.process_name)) or s.pid or "-"),
        )
        for s in statuses
    ]
    console.print(status_table(rows))
    console.print(
        f"[bold green]Serving[/] {escape(plan.model.served_name)} at {escape(plan.client_url)} "
        f"(OpenAI API: base_url {escape(plan.client_url)}/v1). Try:"
    )
    console.print(f"  {_curl_line(ctx)}", markup=False, highlight=False)
    _print_scrapes(ctx, console)
    topology = shlex.quote(str(ctx.topology_file))
    used_hosts = {s.target.host for s in statuses}
    log_dirs = sorted({display_path(h.layout.log_dir) for h in ctx.hosts if h.name in used_hosts})
    console.print(
        f"Logs: pdkit logs {topology} [PROCESS] [-f]  ({', '.join(log_dirs)})", markup=False
    )
    console.print(f"Stop: pdkit down {topology}", markup=False)


def _curl_line(ctx: DeployContext) -> str:
    router = ctx.plan.router
    body = {
        "model": ctx.plan.model.served_name,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 32,
    }
    parts = ["curl", "-s", f"{ctx.plan.client_url}/v1/chat/completions"]
    parts += ["-H", "Content-Type: application/json"]
    line = shlex.join(parts)
    if router.api_key_env:
        line += f' -H "Authorization: Bearer ${router.api_key_env}"'
    elif router.api_key_file:
        key_file = shlex.quote(display_path(router.api_key_file))
        line += f' -H "Authorization: Bearer $(cat {key_file})"'
    return f"{line} -d {shlex.quote(json.dumps(body))}"


def _print_scrapes(ctx: DeployContext, console: Console) -> None:
    """Prometheus' first scrape of every target: how many are up, and why any is not."""
    monitoring = ctx.plan.monitoring
    if monitoring is None:
        return
    try:
        targets = asyncio.run(wait_scraped(monitoring.url, monitoring.scrape_interval_s + 5.0))
    except ProbeError as exc:
        console.print(f"Prometheus: its targets could not be read: {exc}", markup=False)
        return
    up = [t for t in targets if t.health == "up"]
    console.print(
        f"Prometheus: {monitoring.url} scrapes {len(targets)} targets every "
        f"{monitoring.scrape_interval_s:g} s, {len(up)} up. Grafana: pdkit dashboard "
        f"{shlex.quote(str(ctx.topology_file))} > pd.json (import it)",
        markup=False,
    )
    for target in targets:
        if target.health != "up":
            console.print(f"  {_scrape_line(target)}", style="yellow", markup=False)


def _scrape_line(target: ScrapeHealth) -> str:
    why = f": {target.error}" if target.error else ""
    return f"{target.job}/{target.process} ({target.url}) is {target.health}{why}"
