"""What `pdkit up` changes in a running deployment: (recorded state, new state) -> steps. Pure.

Each worker instance (all its node ranks together) is one of:

    add       in the topology, not running: start, readiness, transfer gate, join the router
    replace   running with other settings (or asked to restart): leave the router (drain),
              stop, start, readiness, gate, join again
    remove    running, no longer in the topology: leave the router (drain), stop
    unchanged nothing happens to it

Order: adds first (more capacity), then replacements, then removals (capacity goes last), prefill
before decode, by name. A step whose new processes take GPUs or ports that another step's old
processes hold waits until that step has stopped them (a GPU changing roles: 2P2D to 3P1D on 4
GPUs starts prefill-2 once decode-1 has left GPU 2; scaling alone moves nothing, as a shared
host's prefills take GPUs from the bottom and its decodes from the top). Under
`transfer.backend: nixl` a replaced prefill has every decode replaced after it: SGLang 0.5.23's
decodes keep the old prefill's NIXL peer state and stall on it (sgl-project/sglang#33789; the
fix, PR #34289, is not in 0.5.23).

The router is restarted only when its own settings change (its worker list changes live, through
its worker API); Prometheus when its configuration does.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from kit.deploy.state import DeploymentRecord, ProcessRecord
from kit.errors import DeployError
from kit.hosts.inventory import ROUTER_RELAUNCH_ENV
from kit.topology.args import Flag

StepKind = Literal["add", "replace", "remove"]
KIND_ORDER: dict[StepKind, int] = {"add": 0, "replace": 1, "remove": 2}
ROLE_ORDER = {"prefill": 0, "decode": 1}
NIXL_PREFIX = "reconnect to the replaced "
NIXL_RECONNECT = (
    NIXL_PREFIX + "{prefills}: SGLang 0.5.23's NIXL keeps the old prefill's peer state "
    "(sgl-project/sglang#33789)"
)

Resource = tuple[str, str, int]
"""(host, "gpu" | "port", number): what two processes cannot hold at once."""


@dataclass(frozen=True)
class Step:
    """One instance added, replaced or removed; `old`/`new` are its processes before/after."""

    kind: StepKind
    instance: str
    role: str
    old: tuple[ProcessRecord, ...] = ()
    new: tuple[ProcessRecord, ...] = ()
    reasons: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    """Instances whose old processes this step waits for (they hold its GPUs or ports)."""

    @property
    def old_url(self) -> str | None:
        return next((p.url for p in self.old if p.url), None)

    @property
    def new_url(self) -> str | None:
        return next((p.url for p in self.new if p.url), None)

    @property
    def processes(self) -> tuple[str, ...]:
        """Every process name the step touches, new first."""
        names = [p.name for p in self.new]
        return (*names, *(p.name for p in self.old if p.name not in names))

    def describe(self) -> str:
        """One line for the printed plan, e.g. `replace decode-0 (GPUs 2 -> 3)`."""
        ranks = len(self.new or self.old)
        nodes = f" [{ranks} nodes]" if ranks > 1 else ""
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return f"{self.kind} {self.instance}{nodes}{why}"


@dataclass(frozen=True)
class Changes:
    """Everything `pdkit up` will do, in order."""

    deployment: str
    first: bool
    """Nothing was recorded: every process is deployed as on a first run."""
    steps: tuple[Step, ...] = ()
    unchanged: tuple[str, ...] = ()
    router: tuple[str, ...] = ()
    """Why the router restarts (empty: it keeps running)."""
    monitoring: tuple[str, ...] = ()
    """Why Prometheus restarts (empty: it keeps running or there is none)."""
    serving: dict[str, int] = field(default_factory=dict)
    """Instances per role in the topology (what `waves` keeps serving)."""
    router_handover: bool = False
    """The router restarts by handing its socket over (pdkit's), not by a stop and a start."""

    @property
    def workers_change(self) -> bool:
        return bool(self.steps)

    @property
    def nothing(self) -> bool:
        return not (self.first or self.steps or self.router or self.monitoring)

    def other_than_restarts(self) -> list[str]:
        """What `pdkit restart` would change beyond the restarts it was asked for (and the
        decodes reconnected after them under nixl): a topology change, which is `up`'s job."""
        other = [
            s.describe()
            for s in self.steps
            if s.kind != "replace"
            or not all(r == "restart" or r.startswith(NIXL_PREFIX) for r in s.reasons)
        ]
        if self.router and self.router != ("restart",):
            other.append(f"router ({'; '.join(self.router)})")
        if self.monitoring and self.monitoring != ("restart",):
            other.append(f"Prometheus ({'; '.join(self.monitoring)})")
        return other

    def lines(self) -> list[str]:
        """The plan as printed by `pdkit up` and `pdkit up --diff`."""
        if self.first:
            return ["nothing recorded as running: deploy every process (first run)"]
        out = [f"{i}. {step.describe()}" for i, step in enumerate(self.steps, 1)]
        if self.router:
            out.append(
                f"{len(out) + 1}. restart the router, "
                f"{'handing its socket over' if self.router_handover else 'draining it first'} "
                f"({'; '.join(self.router)})"
            )
        if self.monitoring:
            out.append(f"{len(out) + 1}. restart Prometheus ({'; '.join(self.monitoring)})")
        if not out:
            out.append("no change: every process runs with the topology's settings")
        if self.unchanged:
            out.append(f"unchanged: {', '.join(self.unchanged)}")
        return out


def diff(
    old: DeploymentRecord | None,
    new: DeploymentRecord,
    *,
    restart: Sequence[str] = (),
) -> Changes:
    """The steps from `old` (what runs; None when nothing is recorded) to `new` (the topology).
    `restart`: instances to replace even if unchanged (`pdkit restart`; the router's name
    restarts the router)."""
    if old is None:
        return Changes(new.deployment, first=True)
    before, after = old.instances(), new.instances()
    wanted = set(restart)
    steps: list[Step] = []
    unchanged: list[str] = []
    for name, processes in after.items():
        if name not in before:
            steps.append(Step("add", name, processes[0].role, new=processes))
            continue
        reasons = _reasons(before[name], processes)
        if not reasons and name in wanted:
            reasons = ["restart"]
        if reasons:
            steps.append(
                Step("replace", name, processes[0].role, before[name], processes, tuple(reasons))
            )
        else:
            unchanged.append(name)
    for name, processes in before.items():
        if name not in after:
            steps.append(Step("remove", name, processes[0].role, old=processes))
    if new.transfer_backend == "nixl":
        steps, unchanged = _reconnect_decodes(steps, unchanged, before, after)
    ordered = order(steps)
    return Changes(
        deployment=new.deployment,
        first=False,
        steps=tuple(ordered),
        unchanged=tuple(unchanged),
        router=_single(old, new, "router", restart),
        monitoring=_single(old, new, "monitoring", restart),
        serving={
            role: sum(p[0].role == role for p in after.values()) for role in ("prefill", "decode")
        },
        router_handover=new.router_kind in ROUTER_RELAUNCH_ENV,
    )


def _single(
    old: DeploymentRecord, new: DeploymentRecord, role: str, restart: Sequence[str]
) -> tuple[str, ...]:
    """Why the router (or Prometheus) restarts: its settings changed, or a restart was asked."""
    was = next((p for p in old.processes if p.role == role), None)
    now = next((p for p in new.processes if p.role == role), None)
    if now is None:
        return ()
    if was is None:
        return ("new",)
    reasons = _process_reasons(was, now)
    if not reasons and now.name in restart:
        reasons = ["restart"]
    return tuple(reasons)


def _reasons(old: tuple[ProcessRecord, ...], new: tuple[ProcessRecord, ...]) -> list[str]:
    """Why an instance must be replaced; empty when its processes would not change."""
    if len(old) != len(new):
        return [f"nodes {len(old)} -> {len(new)}"]
    reasons: list[str] = []
    for was, now in zip(old, new, strict=True):
        prefix = f"node {now.node_rank}: " if len(new) > 1 else ""
        reasons += [prefix + r for r in _process_reasons(was, now)]
    return reasons


def _process_reasons(was: ProcessRecord, now: ProcessRecord) -> list[str]:
    if was.fingerprint == now.fingerprint and was.name == now.name:
        return []
    reasons = []
    if was.host != now.host:
        reasons.append(f"host {was.host} -> {now.host}")
    if was.gpus != now.gpus:
        reasons.append(f"GPUs {_gpus(was.gpus)} -> {_gpus(now.gpus)}")
    if was.url != now.url:
        reasons.append(f"URL {was.url} -> {now.url}")
    # The GPUs and the URL said it for these flags already.
    reasons += _arg_changes(was.flags, now.flags, skip=("--base-gpu-id", "--port"))
    keys = sorted(k for k in was.env.keys() | now.env.keys() if was.env.get(k) != now.env.get(k))
    if keys:  # names only: a value may be a token
        reasons.append(f"env {', '.join(keys)}")
    if not reasons:
        reasons.append("its service files change (pdkit's templates, interpreter or host layout)")
    return reasons


def _gpus(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) or "none"


def _flag_values(flags: Iterable[Flag]) -> dict[str, str]:
    """Display only: each flag's values as one text (`("--tp-size", "2")` -> {"--tp-size": "2"})."""
    return {flag[0]: " ".join(flag[1:]) for flag in flags if flag}


def _arg_changes(was: Sequence[Flag], now: Sequence[Flag], skip: Sequence[str]) -> list[str]:
    old, new = _flag_values(was), _flag_values(now)
    out = []
    for flag in [*old, *(f for f in new if f not in old)]:
        if flag in skip or old.get(flag) == new.get(flag):
            continue
        if flag not in new:
            out.append(f"{flag} removed")
        elif flag not in old:
            out.append(f"{flag} {new[flag]} added" if new[flag] else f"{flag} added")
        else:
            out.append(f"{flag} {old[flag]} -> {new[flag]}")
    return out


def _reconnect_decodes(
    steps: list[Step],
    unchanged: list[str],
    before: dict[str, tuple[ProcessRecord, ...]],
    after: dict[str, tuple[ProcessRecord, ...]],
) -> tuple[list[Step], list[str]]:
    prefills = [s.instance for s in steps if s.kind == "replace" and s.role == "prefill"]
    if not prefills:
        return steps, unchanged
    reason = NIXL_RECONNECT.format(prefills=", ".join(prefills))
    out = [
        replace(s, reasons=(*s.reasons, reason))
        if s.kind == "replace" and s.role == "decode"
        else s
        for s in steps
    ]
    kept = []
    for name in unchanged:
        processes = after[name]
        if processes[0].role == "decode":
            out.append(Step("replace", name, "decode", before[name], processes, (reason,)))
        else:
            kept.append(name)
    return out, kept


def holds(processes: Iterable[ProcessRecord]) -> set[Resource]:
    held: set[Resource] = set()
    for p in processes:
        held |= {(p.host, "gpu", g) for g in p.gpus}
        if p.http_port is not None:
            held.add((p.host, "port", p.http_port))
        if p.bootstrap_port is not None:
            held.add((p.host, "port", p.bootstrap_port))
    return held


def order(steps: Sequence[Step]) -> list[Step]:
    """Steps in the order to run them (see the module doc), each with `after` filled in.
    `DeployError` when two steps each need what the other holds (no live order exists)."""
    frees = {s.instance: holds(s.old) for s in steps}
    waits: dict[str, set[str]] = {}
    for step in steps:
        takes = holds(step.new)
        waits[step.instance] = {
            other.instance
            for other in steps
            if other.instance != step.instance and takes & frees[other.instance]
        }
    by_name = {s.instance: s for s in steps}

    def priority(step: Step) -> tuple[int, int, str]:
        return (KIND_ORDER[step.kind], ROLE_ORDER.get(step.role, 2), _natural(step.instance))

    ready = [(priority(s), s.instance) for s in steps if not waits[s.instance]]
    heapq.heapify(ready)
    done: list[Step] = []
    left = {name: set(deps) for name, deps in waits.items()}
    while ready:
        _, name = heapq.heappop(ready)
        done.append(replace(by_name[name], after=tuple(sorted(waits[name]))))
        for other, deps in left.items():
            if name in deps:
                deps.discard(name)
                if not deps:
                    heapq.heappush(ready, (priority(by_name[other]), other))
    if len(done) < len(steps):
        stuck = sorted(n for n, deps in left.items() if deps)
        raise DeployError(
            f"cannot change {', '.join(stuck)} live: each would start on GPUs or ports another "
            "one still holds. To fix: change fewer instances per `pdkit up`, or `pdkit down` "
            "and `pdkit up` (an outage)."
        )
    return done


def _natural(name: str) -> str:
    """Sort key with instance numbers in numeric order (prefill-2 before prefill-10)."""
    return re.sub(r"\d+", lambda m: m.group().zfill(6), name)


def only_instances(changes: Changes, before: DeploymentRecord) -> list[Step]:
    """The replacements that leave their role without another serving instance while they run
    (the role's only instance): `kit.deploy.surge` decides how each is covered."""
    serving = {"prefill": 0, "decode": 0}
    for processes in before.instances().values():
        serving[processes[0].role] += 1
    alone = []
    for step in changes.steps:
        if step.kind == "add":
            serving[step.role] += 1
        elif step.kind == "remove":
            serving[step.role] -= 1
        elif serving[step.role] <= 1:
            alone.append(step)
    return alone


def waves(changes: Changes, parallel: int) -> list[list[Step]]:
    """The steps grouped to run `parallel` at a time: consecutive steps of one kind, none waiting
    for another of its wave, and replacements of a role at most its instance count - 1 at a time
    (so one keeps serving). `parallel` 1: one step per wave."""
    out: list[list[Step]] = []
    for step in changes.steps:
        wave = out[-1] if out else None
        cap = parallel
        if step.kind == "replace":
            cap = min(parallel, max(changes.serving.get(step.role, 1) - 1, 1))
        if (
            wave is not None
            and wave[0].kind == step.kind
            and len(wave) < parallel
            and sum(s.role == step.role for s in wave) < cap
            and not set(step.after) & {s.instance for s in wave}
        ):
            wave.append(step)
        else:
            out.append([step])
    return out
