"""Applying a move: instances change role through SGLang's runtime role switch where they were
started with ``--enable-pd-role-switch``, else through `pdkit up`'s live-change path.

Role switch, the instances of one move at once, each through these stages (the deployment
lock held, so no `pdkit up` runs meanwhile):
    drain      out of the router, its in-flight requests finished (`RouterAdmin.remove`)
    switch     ``POST /pd_role_switch {"new_role": ...}`` (SGLang 0.5.23 refuses unless the
               instance is idle, started with the flag, on a backend that supports it); a
               refusal that leaves it safe puts it back in the router in its old role
    gate       /health, then one real PD request through it and a serving instance of the
               other role (`kit.observe.doctor.probe_pair`)
    join       into the router in its new role (a prefill with its bootstrap port), routed
The Plan is not changed: the router's worker list says which role each instance serves, and a
later `pdkit up` of the unchanged topology puts the topology's split back.

Drain, stop, start: the topology with the new counts is written beside the original (same
folder, so relative paths and the state folder are the same: ``.<file>.autoscale.yaml``) and
deployed live (`kit.deploy.rollout.up`): the instances that change are drained, stopped and
started as any live change does.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rich.console import Console

from kit.autoscale.decide import Split
from kit.deploy.routing import Routed, RouterAdmin
from kit.deploy.steps import DRAIN_TIMEOUT_S, UpOptions, router_key
from kit.errors import DeployError
from kit.hosts.context import DeployContext, deployment_lock
from kit.observe.doctor import Instance, instances, probe_pair
from kit.observe.probe import Prober
from kit.topology.plan_types import Plan

SWITCH_TIMEOUT_S = 120.0
"""Seconds a role switch (the POST) may take."""
HEALTH_TIMEOUT_S = 60.0
GATE_TIMEOUT_S = 60.0
IDLE_POLL_S = 0.5
"""Seconds between two switch requests while SGLang says the drained instance is not idle."""


@dataclass(frozen=True)
class Switched:
    """One instance moved: its name, roles and how long each stage took (s)."""

    instance: str
    old_role: str
    new_role: str
    drain_s: float
    switch_s: float
    gate_s: float
    join_s: float

    def line(self) -> str:
        return (
            f"{self.instance} {self.old_role} -> {self.new_role} (drain {self.drain_s:.1f} s, "
            f"switch {self.switch_s:.2f} s, gate {self.gate_s:.1f} s, join {self.join_s:.1f} s)"
        )


def current_roles(plan: Plan, routed: dict[str, Routed]) -> dict[str, str]:
    """Instance name -> the role it serves now: the router's word, else the Plan's."""
    out = {}
    for role in ("prefill", "decode"):
        for worker in plan.role(role):
            seen = routed.get(worker.url.rstrip("/"))
            out[worker.instance_name] = (
                seen.role if seen and seen.role in ("prefill", "decode") else role
            )
    return out


def splits(plan: Plan, routed: dict[str, Routed]) -> tuple[Split, Split]:
    """(the split the instances are in, the split that serves: healthy in the router)."""
    roles = current_roles(plan, routed)
    serving = {"prefill": 0, "decode": 0}
    for worker in (*plan.role("prefill"), *plan.role("decode")):
        seen = routed.get(worker.url.rstrip("/"))
        if seen is not None and seen.routed:
            serving[roles[worker.instance_name]] += 1
    current = Split(
        sum(1 for r in roles.values() if r == "prefill"),
        sum(1 for r in roles.values() if r == "decode"),
    )
    return current, Split(serving["prefill"], serving["decode"])


def _as(instance: Instance, role: str, plan: Plan) -> Instance:
    """`instance` as it serves in `role` (a prefill needs its bootstrap port)."""
    worker = next(w for w in plan.workers if w.instance_name == instance.name)
    return replace(instance, role=role, bootstrap_port=worker.bootstrap_port)  # type: ignore[arg-type]


def _inflight(routed: dict[str, Routed], url: str) -> int | None:
    seen = routed.get(url.rstrip("/"))
    return seen.inflight if seen is not None else None


def choose(
    roles: dict[str, str],
    plan_roles: dict[str, str],
    inflight: dict[str, int | None],
    giver: str,
    count: int,
) -> list[str]:
    """The `count` instances serving `giver` (`roles`) that move: the fewest requests in
    flight first (the router's count: their drain ends soonest, and a move is slow by its
    slowest drain), then those serving outside their Plan role (`plan_roles`: a switch
    back), then the last names. Pure."""
    ordered = sorted((n for n, r in roles.items() if r == giver), reverse=True)
    ordered.sort(key=lambda n: (inflight.get(n) or 0, plan_roles.get(n) == giver))
    return ordered[:count]


class RoleSwitcher:
    """Moves instances between roles on a running deployment (see the module doc)."""

    def __init__(self, ctx: DeployContext, drain_timeout: float | None = None) -> None:
        self.ctx = ctx
        self.drain_timeout = DRAIN_TIMEOUT_S if drain_timeout is None else drain_timeout

    def _admin(self) -> RouterAdmin:
        router = self.ctx.plan.router
        return RouterAdmin(router.kind, router.url, router_key(self.ctx), self.drain_timeout)

    def move(self, current: Split, target: Split) -> list[Switched]:
        """Switch |target - current| instances of the giving role, as `choose` picks them."""
        with deployment_lock(self.ctx):
            return asyncio.run(self._move(current, target))

    async def _move(self, current: Split, target: Split) -> list[Switched]:
        plan = self.ctx.plan
        giver, taker = (
            ("decode", "prefill") if target.prefill > current.prefill else ("prefill", "decode")
        )
        count = abs(target.prefill - current.prefill)
        async with self._admin() as admin:
            routed = await admin.workers()
            roles = current_roles(plan, routed)
            every = {i.name: i for role in ("prefill", "decode") for i in instances(plan, role)}
            inflight = {w.instance_name: _inflight(routed, w.url) for w in plan.workers}
            chosen = choose(roles, {n: i.role for n, i in every.items()}, inflight, giver, count)
            moving = [every[n] for n in chosen]
            # The instances of one move drain and switch at once: one after another, their
            # drains (each a backlog of the old role's work) add up to the whole phase.
            results = await asyncio.gather(
                *(self._one(admin, instance, giver, taker) for instance in moving),
                return_exceptions=True,
            )
        done = [r for r in results if isinstance(r, Switched)]
        failed = [r for r in results if isinstance(r, BaseException)]
        for exc in failed:
            if not isinstance(exc, Exception):
                raise exc
        if failed:
            switched = "; ".join(s.line() for s in done) or "none"
            raise DeployError(
                f"{len(failed)} of {len(moving)} switches {giver} -> {taker} failed: "
                + "; ".join(str(exc) for exc in failed)
                + f". Switched: {switched}"
            )
        return done

    async def _graphs(self, admin: RouterAdmin) -> dict[str, Any]:
        routed = await admin.workers()
        decodes = [r.url for r in routed.values() if r.role == "decode" and r.routed]
        return await decode_graphs(decodes)

    async def _one(
        self,
        admin: RouterAdmin,
        instance: Instance,
        old: str,
        new: str,
    ) -> Switched:
        plan = self.ctx.plan
        url = instance.url.rstrip("/")
        began = time.monotonic()
        await admin.remove(url)
        drain_s = time.monotonic() - began
        began = time.monotonic()
        graphs = await self._graphs(admin) if new == "decode" else {}
        answer = await _post_switch(url, new, graphs)
        # Out of the router, an instance may still finish work the router no longer sees (a
        # prefill whose KV its decode has not pulled yet): SGLang says "not idle"; ask again
        # until the drain timeout.
        deadline = time.monotonic() + self.drain_timeout
        while not answer.get("success") and "not idle" in str(answer.get("message")):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(IDLE_POLL_S)
            answer = await _post_switch(url, new, graphs)
        switch_s = time.monotonic() - began
        if not answer.get("success"):
            message = str(answer.get("message") or answer)
            if answer.get("safe_to_restore", False):
                await admin.add(
                    url, old, _as(instance, old, plan).bootstrap_port if old == "prefill" else None
                )
            raise DeployError(
                f"{instance.name}: SGLang refused the role switch {old} -> {new}: {message}"
                + (
                    " (put back in the router as " + old + ")"
                    if answer.get("safe_to_restore")
                    else " (it is out of the router: restart it with pdkit restart)"
                )
            )
        began = time.monotonic()
        async with Prober(timeout=GATE_TIMEOUT_S, concurrency=4) as prober:
            await _wait_health(prober, url)
            routed = await admin.workers()
            others = [
                i
                for role in ("prefill", "decode")
                for i in instances(plan, role)
                if current_roles(plan, routed).get(i.name) != new
                and i.name != instance.name
                and routed.get(i.url.rstrip("/"), None) is not None
                and routed[i.url.rstrip("/")].routed
            ]
            if not others:
                raise DeployError(
                    f"{instance.name}: no serving instance of the other role to gate against"
                )
            other_role = "decode" if new == "prefill" else "prefill"
            me, them = _as(instance, new, plan), _as(others[0], other_role, plan)
            pair = (me, them) if new == "prefill" else (them, me)
            result = await probe_pair(prober, pair[0], pair[1], GATE_TIMEOUT_S)
            if result.state != "ok":
                raise DeployError(
                    f"{instance.name}: the gate after switching to {new} failed "
                    f"({result.state}: {result.symptom}); it is out of the router."
                )
        gate_s = time.monotonic() - began
        began = time.monotonic()
        await admin.add(url, new, me.bootstrap_port if new == "prefill" else None)
        await admin.wait_routed(url, HEALTH_TIMEOUT_S)
        join_s = time.monotonic() - began
        return Switched(instance.name, old, new, drain_s, switch_s, gate_s, join_s)


async def _post_switch(url: str, role: str, graphs: dict[str, Any]) -> dict[str, Any]:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{url}/pd_role_switch",
                json={"new_role": role, **graphs},
                timeout=aiohttp.ClientTimeout(total=SWITCH_TIMEOUT_S),
            ) as response,
        ):
            try:
                data = await response.json(content_type=None)
            except ValueError:
                data = {
                    "success": False,
                    "message": f"HTTP {response.status}: {await response.text()}",
                }
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DeployError(
            f"{url}/pd_role_switch: no answer ({exc}); the instance is out of the router"
        ) from exc
    if not isinstance(data, dict):
        return {"success": False, "message": f"HTTP {response.status}: {data!r}"}
    if response.status == 404:
        data.setdefault("message", "the server has no /pd_role_switch (not SGLang 0.5.23?)")
        data["success"] = False
        data["safe_to_restore"] = True
    return data


GRAPH_FIELDS = ("decode_cuda_graph_bs", "decode_cuda_graph_memory_gb")
"""What SGLang's /server_info reports per DP rank of a decode (internal_states) and its role
switch takes on a flip to decode: the graphs to capture and the memory they took on a peer."""


async def decode_graphs(urls: list[str]) -> dict[str, Any]:
    """The decode CUDA-graph fields of the first decode in `urls` that reports them ({} when
    none does: SGLang then refuses a flip that needs them, and says so)."""
    async with Prober(timeout=10.0, concurrency=4) as prober:
        for url in urls:
            states = (await prober.get(f"{url}/server_info")).json() or {}
            for state in states.get("internal_states") or []:
                if isinstance(state, dict) and all(k in state for k in GRAPH_FIELDS):
                    return {k: state[k] for k in GRAPH_FIELDS}
    return {}


async def _wait_health(prober: Prober, url: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        answer = await prober.get(f"{url}/health")
        if answer.ok:
            return
        if time.monotonic() > deadline:
            raise DeployError(f"{url} does not answer /health after its role switch ({answer.why})")
        await asyncio.sleep(0.2)


# -- drain, stop, start ----------------------------------------------------------------------


def derived_topology(topology_file: Path, target: Split) -> Path:
    """The topology with `target`'s counts, written beside `topology_file` (see the module
    doc); its path."""
    data = yaml.safe_load(topology_file.read_text())
    data.setdefault("prefill", {})["count"] = target.prefill
    data.setdefault("decode", {})["count"] = target.decode
    out = topology_file.with_name(f".{topology_file.stem}.autoscale.yaml")
    out.write_text(
        f"# Written by pdkit autoscale from {topology_file.name}: {target.describe()}.\n"
        + yaml.safe_dump(data, sort_keys=False)
    )
    return out


def redeploy(topology_file: Path, target: Split, console: Console, state_base: Path | None) -> Path:
    """Deploy `target` live through `pdkit up` (drain, stop, start); the derived file."""
    from kit.deploy.rollout import up  # noqa: PLC0415 (Ansible is imported with it)
    from kit.plan.resolve import resolve  # noqa: PLC0415

    derived = derived_topology(topology_file, target)
    plan = resolve(derived, state_base=state_base)  # the same discovered facts
    ctx = DeployContext.build(plan, derived, state_base)
    up(ctx, console, UpOptions(gate=True))
    return derived
