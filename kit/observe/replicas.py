"""The router's replicas (router.hosts) and its virtual IP (router.vip) in `pdkit status`,
`pdkit health` and `pdkit doctor`.

1. Each replica is asked /health and /readiness at its own host's address; the VIP is asked
   /health (what clients reach).
2. pdkit's router says in /health when its image started (`started`, unix seconds): distinct
   per replica, so the VIP's answer names the replica that holds the address (keepalived's
   MASTER), without logging in to any host. smg says no such thing: the VIP answers, the
   holder is not known.
3. A replica that is down is a problem (the VIP has no standby left; a site's own balancer
   one backend fewer); so is a VIP that does not answer (keepalived holds it nowhere, or it
   is held where no router answers). Each says what to do.
Pure: `kit.observe.probe.Prober.replicas` asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kit.observe.probe import Fetched, ReplicaAnswers

ReplicaState = Literal["up", "not ready", "down"]


@dataclass(frozen=True)
class ReplicaStatus:
    """One router replica: `processes` running of `of` (pdkit's router.processes; None: one),
    whether it holds the VIP (None: not known, or no VIP)."""

    host: str
    endpoint: str
    state: ReplicaState
    cause: str = ""
    processes: int | None = None
    of: int | None = None
    holds_vip: bool | None = None

    @property
    def ok(self) -> bool:
        return self.state == "up"

    def line(self) -> str:
        text = f"router replica on {self.host} ({self.endpoint}): {self.state}"
        if self.of:
            text += f", {self.processes}/{self.of} processes"
        if self.holds_vip:
            text += ", holds the VIP"
        return text + (f" ({self.cause})" if self.cause else "")


@dataclass(frozen=True)
class VipStatus:
    """The VIP: whether it answers and, where it can be told, which replica holds it."""

    endpoint: str
    answers: bool
    holder: str | None = None
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.answers

    def line(self) -> str:
        if not self.answers:
            return f"router VIP {self.endpoint}: does not answer ({self.cause})"
        held = f"held by {self.holder}" if self.holder else "holder not known"
        return f"router VIP {self.endpoint}: answers, {held}" + (
            f" ({self.cause})" if self.cause else ""
        )


@dataclass(frozen=True)
class ReplicasView:
    replicas: tuple[ReplicaStatus, ...]
    vip: VipStatus | None
    problems: tuple[tuple[str, str, str], ...]
    """(process, endpoint, cause) per problem, as `Finding` takes them."""


def _started(fetched: Fetched) -> float | None:
    data: Any = fetched.json()
    value = data.get("started") if isinstance(data, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _replica(answers: ReplicaAnswers, vip_started: float | None) -> ReplicaStatus:
    endpoint = answers.url.split("://", 1)[-1]
    started = _started(answers.health)
    holds = None if vip_started is None else started == vip_started
    if not answers.health.ok:
        return ReplicaStatus(answers.host, endpoint, "down", answers.health.why, holds_vip=holds)
    body: Any = answers.readiness.json(any_status=True)
    listed = body.get("processes") if isinstance(body, dict) else None
    running = of = None
    if isinstance(listed, list) and listed:
        of = len(listed)
        running = sum(1 for p in listed if isinstance(p, dict) and p.get("running"))
    if not answers.readiness.ok:
        why = f"/readiness {answers.readiness.why}"
        return ReplicaStatus(answers.host, endpoint, "not ready", why, running, of, holds)
    return ReplicaStatus(answers.host, endpoint, "up", "", running, of, holds)


def evaluate_replicas(
    answers: tuple[ReplicaAnswers, ...], vip: Fetched | None, vip_url: str | None, log_path: str
) -> ReplicasView:
    """The replicas' and the VIP's states, and what is wrong with them (`log_path`: the
    router's log file, the same on every replica's host)."""
    vip_started = _started(vip) if vip is not None and vip.ok else None
    replicas = tuple(_replica(a, vip_started) for a in answers)
    problems: list[tuple[str, str, str]] = []
    standby = "the VIP has no standby" if vip_url else "your balancer has one backend fewer"
    for r in replicas:
        if not r.ok:
            problems.append(
                (
                    f"router@{r.host}",
                    r.endpoint,
                    f"router replica {r.state} ({r.cause}): {standby}. To fix: read "
                    f"{log_path} on {r.host}, then `pdkit up` starts it again",
                )
            )
        elif r.of and r.processes is not None and r.processes < r.of:
            problems.append(
                (
                    f"router@{r.host}",
                    r.endpoint,
                    f"{r.of - r.processes} of {r.of} router processes not running",
                )
            )
    vip_status: VipStatus | None = None
    if vip is not None and vip_url is not None:
        endpoint = vip_url.split("://", 1)[-1]
        if not vip.ok:
            vip_status = VipStatus(endpoint, False, cause=vip.why)
            live = [r.host for r in replicas if r.ok]
            where = (
                f"replicas {', '.join(live)} answer, so keepalived holds it nowhere they are"
                if live
                else "no replica answers either"
            )
            problems.append(
                (
                    "router VIP",
                    endpoint,
                    f"does not answer ({vip.why}); {where}. To fix: on each router host, "
                    "`systemctl status keepalived` (or its log); `pdkit provision` installs "
                    "and configures it",
                )
            )
        else:
            holders = [r.host for r in replicas if r.holds_vip]
            cause = "" if holders or vip_started is None else "its router matches no replica"
            vip_status = VipStatus(endpoint, True, holders[0] if holders else None, cause)
    return ReplicasView(replicas, vip_status, tuple(problems))
