"""`pdkit up` on a running deployment, and `pdkit restart`: the steps of `kit.deploy.changes`,
applied while the deployment serves.

Per wave of steps (`--parallel`, one by default):
    leaving (replace, remove)  out of the router and drained (its in-flight requests finish, up
                               to the drain timeout), then stopped (playbooks/stop.yml)
    joining (add, replace)     deployed (deploy.yml --tags workers, those processes only),
                               /health, the KV transfer gate against the serving instances of
                               the other role, into the router, routed to
First, before anything changes, each replacement of a role's only instance is covered
(`kit.deploy.surge`): a surge runs it as three waves in the Plan of the topology with one more
instance of the role (add the stand-in, the replacement, remove the stand-in, then its service
definitions deleted); the hold and a forced gap run it as any other step; a refusal raises.
A replacement at the same URL leaves pdkit's router listing the worker as returning (not
removed), so that requests for its role are held, not refused, while it is away; a failed join
takes it out for good. Each joining wave's phases (stop, start, gate, readmission) are measured
per instance for the next estimate.
The record (`kit.deploy.state`) is saved after each wave, so a failed run leaves it saying what
runs; an instance that failed to join is left out of it and joins on the next `pdkit up`.

Then the router: restarted when its own settings changed (pdkit's load balancer and smg drain on
SIGTERM), else only its files rewritten (the new worker list, for its next start); replicas
(router.hosts) one at a time, each ready before the next (`kit.deploy.replicas`); the service
definitions of removed processes deleted; the router's worker list checked against the topology
(missing workers added, stray ones drained away); and the end of every rollout
(`kit.deploy.steps.finish_rollout`): the router's /readiness, Prometheus (`monitoring:`), the
transfer gate when no step ran it, and what serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from kit.deploy.changes import Changes, Step, only_instances, waves
from kit.deploy.gate import transfer_gate
from kit.deploy.replicas import rollout_order
from kit.deploy.routing import Drained, RouterAdmin
from kit.deploy.state import (
    DeploymentRecord,
    ProcessRecord,
    build_record,
    load_starts,
    load_windows,
    save_record,
    save_starts,
    save_windows,
    templates_digest,
)
from kit.deploy.steps import (
    DRAIN_TIMEOUT_S,
    ROUTER_TIMEOUT_S,
    WORKER_TIMEOUT_S,
    UpOptions,
    deploy_kv_pool,
    finish_rollout,
    play,
    raise_unless_ready,
    router_key,
    wait_until_ready,
)
from kit.deploy.surge import OnlyInstance, decide, stand_in, start_estimate
from kit.deploy.wait import router_targets, worker_targets
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.inventory import CONTROL_ROUTER_KEY_ENV, ROUTER_RELAUNCH_ENV
from kit.hosts.playbook import playbooks_dir
from kit.plan.resolve import resolve_surge
from kit.topology.plan_types import Plan
from kit.topology.restarts import PHASES

Mode = Literal["up", "restart"]
ROUTED_TIMEOUT_S = 60.0
"""Seconds for the router to route to a worker that answers /health (its probes pass)."""


def print_changes(console: Console, changes: Changes) -> None:
    """The plan of a live change, as `pdkit up` and `pdkit up --diff` print it."""
    console.print("[bold]Changes[/]:")
    for line in changes.lines():
        console.print(f"  {line}", markup=False, highlight=False)


def _drained_line(drained: Drained) -> str:
    if drained.clean:
        return f"{drained.url}: out of the router, drained in {drained.seconds:.1f} s"
    left = f" with {drained.left} request(s) still in flight" if drained.left else ""
    return (
        f"{drained.url}: out of the router; the drain timeout passed{left} "
        f"({drained.seconds:.1f} s): those requests fail"
    )


@dataclasses.dataclass
class LiveChange:
    """One `pdkit up` (mode up) or `pdkit restart` (mode restart) of a running deployment."""

    ctx: DeployContext
    console: Console
    options: UpOptions
    secret_env: dict[str, str]
    target: DeploymentRecord
    mode: Mode = "up"
    surge_plans: dict[str, Plan | str] = dataclasses.field(default_factory=dict)
    """By role: the Plan with one more instance of it (a surge's stand-in), or why none."""
    gate_with_running: bool = False
    """The gate pairs a joining instance with every running instance of the other role, not
    only those already on the topology's settings (`pdkit upgrade`: an old decode serves the
    new prefill meanwhile, so that pair must work)."""
    hold_on_failure: bool = False
    """A replacement at the same URL that fails to join stays listed as returning, so that its
    role's requests are still held (`pdkit upgrade`: its rollback brings the old one back
    there); False: it is taken out for good."""

    @property
    def worker_timeout(self) -> float:
        plan = self.ctx.plan
        return (
            self.options.worker_timeout or plan.readiness_timeout_s or WORKER_TIMEOUT_S[plan.engine]
        )

    def _admin(self, url: str | None = None) -> RouterAdmin:
        """The router's worker API (at `url`: one replica's; None: the first's)."""
        router = self.ctx.plan.router
        drain = self.options.drain_timeout
        timeout = DRAIN_TIMEOUT_S if drain is None else drain
        return RouterAdmin(router.kind, url or router.url, router_key(self.ctx), timeout)

    def _inventory(
        self,
        *,
        only: Sequence[str] | None = None,
        stop: Sequence[ProcessRecord] = (),
        remove_others: bool = False,
        router_hosts: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The inventory with this run's selection per host: the workers to deploy (`only`),
        the processes to stop, whether processes no longer in the topology go, and the
        router's hosts to deploy (`router_hosts`; None: every replica)."""
        inventory = self.ctx.inventory()
        if router_hosts is not None:
            group = inventory["all"]["children"]["pdkit_router"]
            group["hosts"] = {h: v for h, v in group["hosts"].items() if h in router_hosts}
        for name, host_vars in inventory["all"]["children"]["pdkit_hosts"]["hosts"].items():
            if only is not None:
                host_vars["pdkit_process_only"] = list(only)
            host_vars["pdkit_process_remove_others"] = remove_others
            host_vars["pdkit_process_stop"] = [
                {"name": p.name, "unit": p.unit, "node_rank": p.node_rank}
                for p in stop
                if p.host == name
            ]
        return inventory

    def _run(self, playbook: str, tags: str | None, inventory: dict[str, Any] | None) -> None:
        result = play(
            self.ctx,
            self.console,
            playbook,
            tags=tags,
            secret_env=self.secret_env,
            verbose=self.options.verbose,
            inventory=inventory,
        )
        self.console.print(f"  {result.progress.summary()}", style="dim", markup=False)

    def _wait_workers(self, names: Iterable[str], stage: str) -> None:
        wanted = set(names)
        targets = [t for t in worker_targets(self.ctx.plan) if t.name in wanted]
        statuses = wait_until_ready(self.ctx, self.console, targets, self.worker_timeout, None)
        raise_unless_ready(self.ctx, statuses, stage=stage)

    def router_down(self) -> str | None:
        """Why the router's worker API does not answer, or None when it does: a live change
        needs it (a router that is down is deployed again as on a first run)."""

        async def ask() -> None:
            async with self._admin() as admin:
                await admin.workers()

        try:
            asyncio.run(ask())
        except DeployError as exc:
            return str(exc)
        return None

    def _surge_plan(self, role: str) -> Plan | str:
        if role not in self.surge_plans:
            self.surge_plans[role] = resolve_surge(
                self.ctx.topology_file, role, state_base=self.ctx.state_dir.parent
            )
        return self.surge_plans[role]

    def _record_of(self, plan: Plan) -> DeploymentRecord:
        digest = templates_digest(playbooks_dir(self.ctx.private_dir))
        return build_record(plan, self.ctx.hosts, digest)

    def cover_only_instances(
        self, changes: Changes, recorded: DeploymentRecord
    ) -> list[OnlyInstance]:
        """How each replacement of a role's only instance is covered (`kit.deploy.surge`):
        a surge where one more instance fits on free GPUs, else the hold where the instance
        starts within it, else `DeployError` naming the gap (unless `--force`)."""
        measured = load_starts(self.ctx.state_dir)
        windows = load_windows(self.ctx.state_dir)
        covers: list[OnlyInstance] = []
        refused: list[str] = []
        for step in only_instances(changes, recorded):
            plan = self._surge_plan(step.role)
            if isinstance(plan, str):
                candidate: tuple[tuple[ProcessRecord, ...], str] = ((), plan)
            else:
                candidate = stand_in(self._record_of(plan), self.target, recorded)
            estimate = start_estimate(step.instance, self.ctx.plan.engine, measured, windows)
            hold = self.ctx.plan.router.hold_timeout_s
            decided = decide(step, candidate, estimate, hold, force=self.options.force)
            if isinstance(decided, str):
                refused.append(decided)
            else:
                covers.append(decided)
        if refused:
            command = "pdkit up" if self.mode == "up" else "pdkit restart"
            raise DeployError(
                f"{'; '.join(refused)}. Nothing was changed. To fix: free GPUs for one more "
                "instance of the role (pdkit then starts a stand-in first), scale the role up "
                "first, or raise router.faults.hold_timeout_s above its time away; or run "
                f"`{command}` again with --force to accept the gap."
            )
        return covers

    def apply(self, changes: Changes, recorded: DeploymentRecord) -> None:
        """Apply `changes` (from `recorded` to the target record); see the module doc."""
        ctx, console = self.ctx, self.console
        covers = {c.step.instance: c for c in self.cover_only_instances(changes, recorded)}
        surges = {name for name, cover in covers.items() if cover.path == "surge"}
        for cover in covers.values():
            console.print(f"  {cover.line()}", markup=False, highlight=False)
        if self.mode == "up" and changes.unchanged:
            names = [p.name for p in self.target.processes if p.instance in changes.unchanged]
            console.print(
                "[bold]Workers[/]: ensuring the unchanged ones run "
                f"({', '.join(changes.unchanged)})"
            )
            self._run("deploy.yml", "workers", self._inventory(only=names))
            self._wait_workers(names, "serving")
        if self.mode == "up" and ctx.plan.kv_pool is not None:
            # Idempotent: starts a master that is not running, restarts one whose flags changed.
            deploy_kv_pool(ctx, console, self.secret_env, self.options.verbose)
        record = recorded
        for wave in waves(changes, self.options.parallel):
            surged = [s for s in wave if s.instance in surges]
            for step in surged:
                record = self._surge(covers[step.instance], record)
            rest = [s for s in wave if s not in surged]
            if rest:
                record = self._wave(rest, record)
        if self.mode == "up" or changes.router:
            self._router(changes)
        monitoring = self.target.process(ctx.plan.monitoring.name) if ctx.plan.monitoring else None
        if self.mode == "restart" and changes.monitoring and monitoring is not None:
            self._run("stop.yml", None, self._inventory(stop=[monitoring]))
        if self.mode == "up" and any(s.kind == "remove" for s in changes.steps):
            console.print("[bold]Workers[/]: deleting the service definitions of removed ones")
            self._run("deploy.yml", "workers", self._inventory(only=[], remove_others=True))
        asyncio.run(self._reconcile())
        save_record(ctx.state_dir, self.target)
        statuses = wait_until_ready(
            ctx, console, worker_targets(ctx.plan), self.worker_timeout, None
        )
        finish_rollout(
            ctx,
            console,
            self.options,
            self.secret_env,
            statuses,
            monitoring=self.mode == "up" or bool(changes.monitoring),
            gate=self.options.gate and not changes.steps and self.mode == "up",
        )

    def _surge(self, cover: OnlyInstance, record: DeploymentRecord) -> DeploymentRecord:
        """The surge path of `cover.step`: its stand-in in (started, gated, routed), the step,
        the stand-in out (drained, stopped, its service definitions deleted)."""
        step = cover.step
        plan = self._surge_plan(step.role)
        assert not isinstance(plan, str)
        surge = dataclasses.replace(
            self, ctx=dataclasses.replace(self.ctx, plan=plan), target=self._record_of(plan)
        )
        name = cover.stand_in_name
        self.console.print(
            f"[bold]Surge[/]: {escape(name)} stands in while {escape(step.instance)} is replaced"
        )
        why = (f"stand-in while {step.instance} is replaced",)
        add = Step("add", name, step.role, new=cover.stand_in, reasons=why)
        remove = Step("remove", name, step.role, old=cover.stand_in, reasons=("surge done",))
        try:
            record = surge._wave([add], record)
        except DeployError as exc:
            # Nothing else was touched: take the stand-in away again and say so.
            self._run("stop.yml", None, surge._inventory(stop=cover.stand_in))
            self._run("deploy.yml", "workers", self._inventory(only=[], remove_others=True))
            raise DeployError(
                f"{exc}\nThe stand-in {name} was stopped and its service definitions deleted; "
                f"{step.instance} was not touched and serves as before."
            ) from exc
        record = surge._wave([step], record)
        record = surge._wave([remove], record)
        self.console.print(f"  deleting the service definitions of {name}", markup=False)
        self._run("deploy.yml", "workers", self._inventory(only=[], remove_others=True))
        return record

    def _wave(self, wave: list[Step], record: DeploymentRecord) -> DeploymentRecord:
        """One wave of steps; returns the record as it stands after it."""
        self.console.print(f"[bold]{escape('; '.join(s.describe() for s in wave))}[/]")
        leaving = [s for s in wave if s.kind != "add"]
        joining = [s for s in wave if s.kind != "remove"]
        # Replaced where they are: the router holds their role's requests until they are back.
        returning = [s.old_url for s in leaving if s.old_url and s.old_url == s.new_url]
        phases: dict[str, float] = {}
        began = time.monotonic()
        if leaving:
            urls = [s.old_url for s in leaving if s.old_url]
            back = self._back_within() if returning else 0.0
            for drained in asyncio.run(self._take_out(urls, set(returning), back)):
                self.console.print(f"  {_drained_line(drained)}", markup=False, highlight=False)
            if returning:
                self.console.print(
                    f"  the router holds their role's requests until they are back (at most "
                    f"{back:.0f} s): {', '.join(returning)}",
                    markup=False,
                    highlight=False,
                )
            stopping = [p for s in leaving for p in s.old]
            self.console.print(f"  stopping {', '.join(p.name for p in stopping)}", markup=False)
            self._run("stop.yml", None, self._inventory(stop=stopping))
            record = record.without(p.name for p in stopping)
            save_record(self.ctx.state_dir, record)
            phases["stop"] = time.monotonic() - began
        if not joining:
            return record
        names = [p.name for s in joining for p in s.new]
        started = time.monotonic()
        try:
            self._run("deploy.yml", "workers", self._inventory(only=names))
            self._wait_workers(names, "joining")
            phases["start"] = time.monotonic() - started
            save_starts(self.ctx.state_dir, {s.instance: phases["start"] for s in joining})
            if self.options.gate:
                gated = time.monotonic()
                self._gate(joining, record)
                phases["gate"] = time.monotonic() - gated
            joined = time.monotonic()
            asyncio.run(self._join(joining))
            phases["readmit"] = time.monotonic() - joined
        except (DeployError, KeyboardInterrupt):
            if returning and not self.hold_on_failure:  # not coming back: no more holding
                asyncio.run(self._take_out(returning, set(), 0.0))
            raise
        save_windows(self.ctx.state_dir, {s.instance: phases for s in joining})
        if leaving:
            away = ", ".join(f"{PHASES[p]} {v:.1f} s" for p, v in phases.items())
            self.console.print(
                f"  away {time.monotonic() - began:.1f} s ({away})", markup=False, highlight=False
            )
        order = [p.name for p in self.target.processes]
        record = record.with_processes((p for s in joining for p in s.new), order)
        save_record(self.ctx.state_dir, record)
        return record

    def _back_within(self) -> float:
        """The longest pdkit may take to bring a replaced instance back (its start, the gate's
        pairs, the router's routing): past it, pdkit's router stops holding for it."""
        gate = self.options.gate_options.timeout_s * len(self.ctx.plan.workers)
        return self.worker_timeout + gate + ROUTED_TIMEOUT_S

    async def _take_out(self, urls: list[str], returning: set[str], back: float) -> list[Drained]:
        async with self._admin() as admin:
            return list(
                await asyncio.gather(
                    *(admin.remove(url, back if url in returning else 0.0) for url in urls)
                )
            )

    async def _join(self, joining: list[Step]) -> None:
        async with self._admin() as admin:
            for step in joining:
                rank0 = next(p for p in step.new if p.url)
                assert rank0.url is not None
                await admin.add(rank0.url, step.role, rank0.bootstrap_port)
            for step in joining:
                url = step.new_url
                assert url is not None
                await admin.wait_routed(url, ROUTED_TIMEOUT_S)
                self.console.print(f"  {step.instance}: in the router ({url})", markup=False)

    def _gate(self, joining: list[Step], record: DeploymentRecord) -> None:
        """The transfer gate for the joining instances: each against every instance of the
        other role that already runs with the topology's settings, and the other joining ones."""
        before, after = record.instances(), self.target.instances()
        serving = {
            name
            for name, procs in before.items()
            if procs == after.get(name) or (self.gate_with_running and name in after)
        }
        candidates = serving | {s.instance for s in joining}
        for role in ("prefill", "decode"):
            mine = {s.instance for s in joining if s.role == role}
            if not mine:
                continue
            keep = mine | {n for n in candidates if after[n][0].role != role}
            workers = tuple(w for w in self.ctx.plan.workers if w.instance_name in keep)
            if not any(w.role != role for w in workers):
                continue
            sub = self.ctx.plan.model_copy(update={"workers": workers})
            try:
                transfer_gate(
                    dataclasses.replace(self.ctx, plan=sub), self.console, self.options.gate_options
                )
            except DeployError as exc:
                raise DeployError(
                    f"{exc}\n{', '.join(sorted(mine))} did not join the router; everything else "
                    "serves as before."
                ) from exc

    def _router(self, changes: Changes) -> None:
        """Restart the router (its settings changed, or `pdkit restart ... router`), or rewrite
        its files only. pdkit's router is handed over (`kit.lb.run`: SIGUSR2, it finishes its
        requests and execs its launch script again on the same socket; connections wait, none
        is refused) unless its service definition changed; smg is stopped with SIGTERM, on
        which it drains, and started again."""
        router = self.target.process(self.ctx.plan.router.name)
        handover = self.ctx.plan.router.kind in ROUTER_RELAUNCH_ENV
        if len(self.ctx.plan.router_replicas) > 1:
            self._router_replicas(changes, router, handover)
            return
        if not changes.router:
            self.console.print(
                "[bold]Router[/]: keeps running; its files get the worker list for its next start"
            )
            self._run("deploy.yml", "router", None)
            return
        why = escape("; ".join(changes.router))
        if not handover:
            self.console.print(
                f"[bold]Router[/]: restarting ({why}); it drains its in-flight requests first "
                "and refuses new ones meanwhile"
            )
            if changes.router == ("restart",) and router is not None:
                # Its files are the same: stop it here, the deploy below starts it again.
                self._run("stop.yml", None, self._inventory(stop=[router]))
            self._run("deploy.yml", "router", None)
            return
        self.console.print(
            f"[bold]Router[/]: handing over to a new process on its socket ({why}); it finishes "
            "its in-flight requests, new connections wait for the new one, none is refused"
        )
        before = self._router_started()
        inventory = self._inventory()
        if changes.router == ("restart",) and router is not None:
            for host_vars in inventory["all"]["children"]["pdkit_hosts"]["hosts"].values():
                host_vars["pdkit_process_hand_over"] = [router.name]
        began = time.monotonic()
        self._run("deploy.yml", "router", inventory)
        if before is None:
            return  # not answering before: the deploy started it, readiness follows

        async def back() -> float:
            async with self._admin() as admin:
                return await admin.wait_started_after(before, self.worker_timeout)

        asyncio.run(back())
        self.console.print(
            f"  router: handed over in {time.monotonic() - began:.1f} s", markup=False
        )

    def _router_replicas(
        self, changes: Changes, router: ProcessRecord | None, handover: bool
    ) -> None:
        """router.hosts: the replicas one at a time (`kit.deploy.replicas`), each gated on a
        new image that is ready before the next is touched."""
        steps = rollout_order(self.ctx.plan)
        why = escape("; ".join(changes.router)) or "its files get the worker list"
        how = "handed over on its socket" if handover else "restarted"
        self.console.print(
            f"[bold]Router[/]: {len(steps)} replicas, one at a time ({why}); each is {how}, "
            "then must answer /readiness before the next is touched"
        )
        key = self.secret_env.get(CONTROL_ROUTER_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else None
        timeout = self.options.router_timeout or ROUTER_TIMEOUT_S
        restart = changes.router == ("restart",) and router is not None
        for step in steps:
            began = time.monotonic()
            # Without a changed setting only a later replica's worker list may change (its
            # playbook restarts it then): no new image to wait for, only /readiness.
            before = self._router_started(step.url) if handover and changes.router else None
            inventory = self._inventory(router_hosts=[step.host])
            if restart and handover:
                inventory["all"]["children"]["pdkit_hosts"]["hosts"][step.host][
                    "pdkit_process_hand_over"
                ] = [self.ctx.plan.router.name]
            elif restart and router is not None:
                on_host = router.model_copy(update={"host": step.host})
                self._run("stop.yml", None, self._inventory(stop=[on_host]))
            self._run("deploy.yml", "router", inventory)
            try:
                if before is not None:
                    asyncio.run(self._wait_started_after(step.url, before, timeout))
                targets = router_targets(self.ctx.plan, [step.host])
                statuses = wait_until_ready(self.ctx, self.console, targets, timeout, headers)
                raise_unless_ready(self.ctx, statuses, stage="router")
            except DeployError as exc:
                left = [s.host for s in steps if s.index > step.index]
                rest = f"; {', '.join(left)} not touched (as before)" if left else ""
                raise DeployError(
                    f"{exc}\nThe router {step.line('did not come back')}{rest}. To fix: see "
                    "its log (pdkit logs), then `pdkit up` again."
                ) from exc
            self.console.print(
                f"  router {step.line(f'ready in {time.monotonic() - began:.1f} s')}",
                markup=False,
            )

    async def _wait_started_after(self, url: str, before: float, timeout: float) -> None:
        async with self._admin(url) as admin:
            await admin.wait_started_after(before, timeout)

    def _router_started(self, url: str | None = None) -> float | None:
        async def ask() -> float | None:
            async with self._admin(url) as admin:
                return await admin.started()

        try:
            return asyncio.run(ask())
        except DeployError:
            return None

    async def _reconcile(self) -> None:
        """The router's worker list against the topology: add the missing, drain away strays."""
        wanted = {w.url: w for w in self.ctx.plan.workers if w.serves_http}
        async with self._admin() as admin:
            listed = await admin.workers()
            for url, worker in wanted.items():
                if url in listed and listed[url].state != "returning":
                    continue
                self.console.print(
                    f"  {worker.instance_name} was not in the router: adding it", markup=False
                )
                await admin.add(url, worker.role, worker.bootstrap_port)
                await admin.wait_routed(url, ROUTED_TIMEOUT_S)
            for url in sorted(set(listed) - set(wanted)):
                drained = await admin.remove(url)
                self.console.print(
                    f"  not in the topology: {_drained_line(drained)}",
                    markup=False,
                    highlight=False,
                )
