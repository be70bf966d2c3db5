"""How `pdkit restart` and a live `pdkit up` replace a role's only instance. Pure decisions.

Replacing an instance drains it out of the router first; when it is its role's only serving
instance the role has none until the new one is in. Per such step, one path:

    surge  one more instance of the role fits on free GPUs and ports (the Plan of the topology
           with that role's count + 1 places it there and every other instance where it is,
           and no running process holds them): that stand-in (the role's next instance name,
           e.g. decode-1) is started, gated (readiness, the KV transfer gate for its pairs) and
           added to the router; the instance is then replaced where it is (drained, stopped,
           started, gated, added) while the stand-in serves; then the stand-in is drained and
           stopped. No moment without a serving instance, at the price of two starts; after it
           every process runs where the topology places it, so the record, `pdkit status` and
           the next `pdkit up` see the topology and no change.
    hold   no room for a stand-in, and the instance's expected time away is shorter than the
           router's hold (pdkit's router.faults.hold_timeout_s): the router lists it as
           returning meanwhile (not removed), so requests for its role wait for it.
    gap    neither: the role would have no instance for longer than the hold, and requests
           would fail; refused without `--force`, with the estimate and where it comes from.

The expected time away is the whole window its role's requests wait: stop (out of the router,
drained, stopped), start (deploy playbook to /health), gate (the KV transfer gate) and
readmission (into the router, routed to). Each phase is the worst of the instance's recent
replacements on these hosts (every `pdkit restart` and live `pdkit up` records its last
`RECENT_WINDOWS` in the state dir; every `pdkit up` its starts), else pdkit's figure for the
engine (`kit.topology.restarts`, which `pdkit validate` warns with too); the sum times `MARGIN`,
since a window measured on a quiet machine stretches under load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kit.deploy.changes import Step, holds
from kit.deploy.state import DeploymentRecord, ProcessRecord
from kit.topology.restarts import EXPECTED_S, MARGIN, PHASES

Cover = Literal["surge", "hold", "gap"]


@dataclass(frozen=True)
class StartEstimate:
    """How long an instance is away when replaced (seconds, all phases, margin included), and
    where the figure comes from (each phase's seconds, which were measured, the margin)."""

    seconds: float
    source: str


def start_estimate(
    instance: str,
    engine: str,
    starts: dict[str, float],
    windows: dict[str, list[dict[str, float]]] | None = None,
) -> StartEstimate:
    """`instance`'s expected time away: per phase the worst of its recent measured replacements
    (`windows`, by instance a list of seconds by phase), for the start else its last measured
    start (`starts`), else the engine's figure (`EXPECTED_S`); their sum times `MARGIN`."""
    recent = (windows or {}).get(instance, [])
    window = {p: max(w[p] for w in recent if p in w) for p in PHASES if any(p in w for w in recent)}
    if "start" not in window and instance in starts:
        window = window | {"start": starts[instance]}
    phases = {p: window.get(p, EXPECTED_S[engine][p]) for p in PHASES}
    parts = ", ".join(f"{name} {phases[p]:.1f} s" for p, name in PHASES.items())
    measured = [name for p, name in PHASES.items() if p in window]
    last = "its last replacement" if len(recent) <= 1 else f"the worst of its last {len(recent)}"
    if len(measured) == len(PHASES):
        where = f"{last} on these hosts, measured"
    elif measured:
        where = (
            f"{', '.join(measured)} measured on these hosts, the rest pdkit's figures for engine "
            f"{engine}"
        )
    else:
        where = f"pdkit's figures for engine {engine}; none measured yet"
    total = sum(phases.values())
    margin = f"x{MARGIN:g} for load, which stretches a window"
    return StartEstimate(total * MARGIN, f"{parts}: {where}; {total:.1f} s {margin}")


@dataclass(frozen=True)
class OnlyInstance:
    """How the replacement of a role's only instance is covered (see the module doc)."""

    step: Step
    path: Cover
    stand_in: tuple[ProcessRecord, ...] = ()
    """The surge path's stand-in instance, its processes (from the surge Plan's record)."""
    why_no_surge: str = ""
    estimate: StartEstimate | None = None
    hold_s: float = 0.0

    @property
    def stand_in_name(self) -> str:
        return self.stand_in[0].instance if self.stand_in else ""

    def gap_phrase(self) -> str:
        """`decode-0 would leave the decodes without an instance for at least 6 s (...)`."""
        assert self.estimate is not None
        return (
            f"{self.step.instance} would leave the {self.step.role}s without an instance for "
            f"about {self.estimate.seconds:.0f} s ({self.estimate.source})"
        )

    def line(self) -> str:
        """What is printed for it: the path taken and why."""
        step = self.step
        if self.path == "surge":
            where = _where(self.stand_in)
            return (
                f"{step.instance} is the only {step.role}: surge: {self.stand_in_name} starts "
                f"first on {where} (free) and serves while {step.instance} is replaced, then "
                "leaves"
            )
        hold = f"the router's hold ({self.hold_s:g} s, router.faults.hold_timeout_s)"
        if self.path == "hold":
            assert self.estimate is not None
            return (
                f"{step.instance} is the only {step.role} and no GPU is free for a stand-in "
                f"({self.why_no_surge}): hold: it is expected back within {hold} "
                f"(away {self.estimate.seconds:.0f} s: {self.estimate.source})"
            )
        return (
            f"{step.instance} is the only {step.role} and no GPU is free for a stand-in "
            f"({self.why_no_surge}): forced: {self.gap_phrase()}, longer than {hold}; "
            "requests fail past the hold"
        )


def _where(processes: tuple[ProcessRecord, ...]) -> str:
    parts = []
    for p in processes:
        gpus = ",".join(map(str, p.gpus))
        port = f", port {p.http_port}" if p.http_port is not None else ""
        noun = "GPU" if len(p.gpus) == 1 else "GPUs"
        parts.append(f"{p.host} {noun} {gpus}{port}")
    return "; ".join(parts)


def stand_in(
    surge: DeploymentRecord, target: DeploymentRecord, running: DeploymentRecord
) -> tuple[tuple[ProcessRecord, ...], str]:
    """The stand-in of the surge record (`target` plus one instance), or why it cannot serve as
    one: `((), reason)` when the other instances would move, or a running process holds its
    GPUs or ports."""
    ours, theirs = surge.instances(), target.instances()
    extra = [name for name in ours if name not in theirs]
    if len(extra) != 1 or any(_where_key(ours.get(n)) != _where_key(p) for n, p in theirs.items()):
        return (), "one more instance would move the others"
    processes = ours[extra[0]]
    taken = holds(processes) & holds(running.processes)
    if taken:
        host, kind, number = sorted(taken)[0]
        return (), f"{kind} {number} on {host} is in use"
    return processes, ""


def _where_key(processes: tuple[ProcessRecord, ...] | None) -> object:
    if processes is None:
        return None
    return [(p.name, p.host, p.gpus, p.http_port, p.bootstrap_port, p.flags) for p in processes]


def decide(
    step: Step,
    surge: tuple[tuple[ProcessRecord, ...], str],
    estimate: StartEstimate,
    hold_s: float,
    *,
    force: bool,
) -> OnlyInstance | str:
    """How `step` (the replacement of its role's only instance) is covered: the surge path when
    `surge` holds a stand-in (see `stand_in`), else the hold when `estimate` is shorter than
    `hold_s`, else the gap, forced; without `force` the refusal's text instead."""
    processes, why = surge
    if processes:
        return OnlyInstance(step, "surge", stand_in=processes)
    decided = OnlyInstance(step, "hold", why_no_surge=why, estimate=estimate, hold_s=hold_s)
    if estimate.seconds < hold_s:
        return decided
    if force:
        return OnlyInstance(step, "gap", why_no_surge=why, estimate=estimate, hold_s=hold_s)
    held = (
        f"the router holds requests only {hold_s:g} s (router.faults.hold_timeout_s)"
        if hold_s > 0
        else "the router holds no request (smg, or router.faults.hold_timeout_s 0)"
    )
    return (
        f"{decided.gap_phrase()}, and no GPU is free for a stand-in ({why}); {held}, so "
        "requests would fail"
    )
