"""`pdkit up`, `pdkit restart` and `pdkit down`: the order of things and what the user is told.

up:      with nothing recorded as running (or a router that does not answer), everything:
         the reachability preflight (kit.hosts.reach: every port a host must reach on another
         host, before anything starts) -> (kv_pool:) deploy.yml --tags kv_pool and the
         master's /health -> deploy.yml --tags workers -> wait for every worker's /health ->
         deploy.yml --tags router -> the end of a rollout (kit.deploy.steps.finish_rollout:
         the router's /readiness -> (monitoring:) deploy.yml --tags monitoring and
         Prometheus' /-/ready -> the KV transfer gate (kit.deploy.gate: one PD request per
         prefill x decode pair; --no-gate skips it) -> endpoint, curl line, status table,
         Prometheus' first scrapes); on a running deployment, only the difference, live
         (kit.deploy.live).
restart: the selected instances replaced live, one wave at a time (kit.deploy.live); a role's
         only instance with a stand-in on free GPUs first, else within the router's hold, else
         refused unless --force (kit.deploy.surge).
down:    down.yml (router first, then workers, then the KV pool's master with the deployment's
         supervisord); logs stay.

Every failure raises `DeployError` with what failed (host, task or process, its stderr or log
tail) and what is still running.
"""

from __future__ import annotations

import os
import shlex
import time

from rich.console import Console
from rich.markup import escape

from kit.deploy.changes import Changes, diff
from kit.deploy.live import LiveChange, print_changes
from kit.deploy.services import can_probe, host_processes
from kit.deploy.state import (
    DeploymentRecord,
    build_record,
    forget_record,
    load_record,
    save_record,
    save_starts,
    templates_digest,
)
from kit.deploy.steps import (
    WORKER_TIMEOUT_S,
    UpOptions,
    deploy_kv_pool,
    finish_rollout,
    play,
    playbook_secret_env,
    raise_unless_ready,
    reach_preflight,
    wait_until_ready,
)
from kit.deploy.wait import worker_targets
from kit.errors import DeployError
from kit.hosts.context import DeployContext, deployment_lock
from kit.hosts.playbook import playbooks_dir
from kit.hosts.state_dir import display_path


def up(ctx: DeployContext, console: Console, options: UpOptions) -> None:
    """Deploy the topology: everything on a first run; on a running deployment only the
    difference to what the record says runs, live (kit.deploy.live). Returns once it serves."""
    with deployment_lock(ctx):
        recorded = load_record(ctx.state_dir)
        target = build_record(ctx.plan, ctx.hosts, templates_digest(playbooks_dir(ctx.private_dir)))
        changes = diff(recorded, target)
        if options.diff_only:
            _header(ctx, console, "pdkit up --diff")
            print_changes(console, changes)
            if recorded is not None:
                _print_covers(LiveChange(ctx, console, options, {}, target), changes, recorded)
            console.print("Nothing was changed (--diff).")
            return
        secret_env = playbook_secret_env(ctx)
        live = LiveChange(ctx, console, options, secret_env, target)
        down = live.router_down() if recorded is not None else None
        if recorded is None or down:
            if down:
                console.print(
                    f"The router does not answer ({down}): deploying every process as on a "
                    "first run (processes whose files change restart at once).",
                    style="yellow",
                    markup=False,
                )
            _up(ctx, console, options, secret_env)
        else:
            _header(ctx, console, "pdkit up")
            print_changes(console, changes)
            live.apply(changes, recorded)
        save_record(ctx.state_dir, target)


def restart(ctx: DeployContext, console: Console, options: UpOptions, selector: str | None) -> None:
    """Replace the selected processes' instances one at a time (drain, restart, readiness,
    gate, rejoin) without a topology change; `router` restarts the router (draining first)."""
    with deployment_lock(ctx):
        recorded = load_record(ctx.state_dir)
        topology = shlex.quote(str(ctx.topology_file))
        if recorded is None:
            raise DeployError(
                f"nothing of deployment {ctx.plan.name} is recorded as running, so there is "
                f"nothing to restart. To fix: `pdkit up {topology}`."
            )
        names = ctx.select_processes(selector)
        if selector is None:
            names = [w.name for w in ctx.plan.workers]
        instances = [_instance_of(ctx, name) for name in names]
        target = build_record(ctx.plan, ctx.hosts, templates_digest(playbooks_dir(ctx.private_dir)))
        changes = diff(recorded, target, restart=instances)
        other = changes.other_than_restarts()
        if other:
            raise DeployError(
                "the topology differs from what runs, so a restart would change more than "
                f"{selector or 'the workers'}: {'; '.join(other)}. Nothing was changed. To fix: "
                f"`pdkit up {topology}` applies the topology (rolling); `pdkit up {topology} "
                "--diff` shows the difference."
            )
        _header(ctx, console, "pdkit restart")
        print_changes(console, changes)
        LiveChange(ctx, console, options, playbook_secret_env(ctx), target, mode="restart").apply(
            changes, recorded
        )
        save_record(ctx.state_dir, target)


def _print_covers(live: LiveChange, changes: Changes, recorded: DeploymentRecord) -> None:
    """`pdkit up --diff`: how each replacement of a role's only instance would be covered."""
    try:
        covers = live.cover_only_instances(changes, recorded)
    except DeployError as exc:
        live.console.print(f"  pdkit up would refuse: {exc}", style="yellow", markup=False)
        return
    for cover in covers:
        live.console.print(f"  {cover.line()}", markup=False, highlight=False)


def _instance_of(ctx: DeployContext, process: str) -> str:
    found = ctx.plan.process(process)
    return getattr(found, "instance_name", found.name)


def _header(ctx: DeployContext, console: Console, command: str) -> None:
    plan = ctx.plan
    console.print(
        f"[bold]{command} {plan.name}[/]: engine {plan.engine}, {len(plan.role('prefill'))} "
        f"prefill + {len(plan.role('decode'))} decode, router {plan.router.kind} on "
        f"{plan.router.host} (state: {escape(display_path(ctx.state_dir))})"
    )


def _up(
    ctx: DeployContext, console: Console, options: UpOptions, secret_env: dict[str, str]
) -> None:
    plan = ctx.plan
    _header(ctx, console, "pdkit up")
    reach_preflight(ctx, console)
    pool_status = deploy_kv_pool(ctx, console, secret_env, options.verbose)
    console.print("[bold]Workers[/]: installing and starting (Ansible, deploy.yml --tags workers)")
    started = time.monotonic()
    result = play(
        ctx, console, "deploy.yml", tags="workers", secret_env=secret_env, verbose=options.verbose
    )
    console.print(f"  {result.progress.summary()}", style="dim", markup=False)
    worker_timeout = (
        options.worker_timeout or plan.readiness_timeout_s or WORKER_TIMEOUT_S[plan.engine]
    )
    console.print(f"[bold]Workers[/]: waiting for /health (timeout {worker_timeout:.0f} s)")
    played = time.monotonic() - started
    statuses = wait_until_ready(ctx, console, worker_targets(plan), worker_timeout, None)
    raise_unless_ready(ctx, statuses, stage="workers")
    instance = {w.name: w.instance_name for w in plan.workers}
    starts: dict[str, float] = {}
    for status in statuses:  # an instance is up once its slowest node is
        name = instance[status.target.name]
        starts[name] = max(starts.get(name, 0.0), played + status.elapsed)
    save_starts(ctx.state_dir, starts)

    console.print("[bold]Router[/]: installing and starting (Ansible, deploy.yml --tags router)")
    result = play(
        ctx, console, "deploy.yml", tags="router", secret_env=secret_env, verbose=options.verbose
    )
    console.print(f"  {result.progress.summary()}", style="dim", markup=False)
    finish_rollout(
        ctx,
        console,
        options,
        secret_env,
        pool_status + statuses,
        monitoring=True,
        gate=options.gate,
    )


def down(ctx: DeployContext, console: Console, verbose: bool = False) -> None:
    """Stop the router, then the workers; keep configuration and logs."""
    plan = ctx.plan
    last = ", then the KV pool's master" if plan.kv_pool else ""
    console.print(f"[bold]pdkit down {plan.name}[/]: router first, then workers{last}")
    if _nothing_deployed(ctx):
        console.print(f"Nothing of deployment {plan.name} was running.")
        return
    with deployment_lock(ctx):
        result = play(ctx, console, "down.yml", tags=None, secret_env={}, verbose=verbose)
        forget_record(ctx.state_dir)
    logs = sorted({h.layout.log_dir for h in ctx.hosts})
    if result.progress.changed:
        hosts = sorted({c.host for c in result.progress.changes})
        console.print(
            f"Stopped deployment {plan.name} on {', '.join(hosts)}. "
            f"Logs kept in {', '.join(display_path(p) for p in logs)}",
            markup=False,
        )
    else:
        console.print(f"Nothing of deployment {plan.name} was running.")


def _nothing_deployed(ctx: DeployContext) -> bool:
    """True when every host is local under supervisord with neither a running supervisord nor
    program definitions: down.yml would change nothing there, so it need not run."""
    return all(
        can_probe(host)
        and host_processes(host) is None
        and not os.path.exists(host.layout.supervisord_program_dir)
        for host in ctx.hosts
    )
