"""When is a process ready, starting or failed? Pure functions over what a poll observed; the
polling loop is `kit.deploy.wait`.

A worker is ready when its HTTP ``/health`` answers 200 (SGLang answers 503 while it loads);
the router when ``/readiness`` answers 200 (pdkit's lb and smg both answer 503 until they have
a healthy prefill and decode). A multi-node instance is ready when its rank-0 HTTP is: the other
nodes serve no HTTP and follow rank 0's verdict, unless their own service failed.

Where the service manager can be asked (supervisord on a local host; systemd on any host, with
`systemctl show` over SSH), its view wins over HTTP: a process that exited since the rollout
(even if its manager restarted it) has failed, so a worker that dies on a taken port fails
within one poll instead of at the timeout; a systemd unit that hit its start limit (a crash
loop, `StartLimitBurst`) is named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["waiting", "starting", "ready", "failed", "timeout"]
"""waiting: nothing answers yet; starting: the process answers but is not ready (503) or the
service manager says it starts; ready; failed: it exited or answered an error; timeout: still
not ready when the time was up."""

RUNNING_STATES = frozenset({"STARTING", "RUNNING"})
FAILED_STATES = frozenset({"BACKOFF", "FATAL", "EXITED", "STOPPED", "STOPPING", "UNKNOWN"})


@dataclass(frozen=True)
class ServiceInfo:
    """What the service manager says about one process (times in seconds since the epoch,
    0 = never). `state` is in supervisord's words; systemd's are mapped onto them
    (kit.deploy.services.systemd_info) and kept in `shown`. `restarts`: the automatic restarts
    systemd counts (NRestarts; a start by pdkit resets it), 0 under supervisord."""

    name: str
    state: str
    pid: int
    start: float
    stop: float
    exit_status: int
    description: str
    manager: str = "supervisord"
    restarts: int = 0
    shown: str = ""


@dataclass(frozen=True)
class HttpAnswer:
    """One GET: the status, or why there was none (refused, timeout, ...)."""

    status: int | None
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    state: State
    detail: str

    @property
    def done(self) -> bool:
        return self.state in ("ready", "failed", "timeout")


def evaluate_service(service: ServiceInfo | None, since: float) -> Verdict | None:
    """A failure verdict from the service manager's view, or None when it shows no failure.

    `since` is when the rollout finished: a stop after it is a crash, not pdkit's own restart.
    """
    if service is None:
        return None
    manager = service.manager
    if service.state in FAILED_STATES:
        exit_part = f", exit status {service.exit_status}" if service.state != "STOPPED" else ""
        reason = service.description or service.state.lower()
        what = (
            "exited during startup" if service.state in ("BACKOFF", "FATAL") else "is not running"
        )
        shown = service.shown or service.state
        return Verdict("failed", f"{what} ({manager} {shown}: {reason}{exit_part})")
    restarted = (
        service.restarts > 0 and service.start >= since > 0
        if manager == "systemd"
        else service.stop >= since > 0
    )
    if restarted and service.state in RUNNING_STATES:
        count = f" ({service.restarts} restart(s))" if service.restarts else ""
        return Verdict(
            "failed",
            f"exited (exit status {service.exit_status}) and {manager} started it again{count}",
        )
    return None


def evaluate_http(answer: HttpAnswer, ready_path: str) -> Verdict:
    """The verdict from one HTTP answer to `ready_path` (/health or /readiness)."""
    if answer.status == 200:
        return Verdict("ready", f"{ready_path} 200")
    if answer.status is None:
        return Verdict("waiting", f"no answer yet ({answer.error or 'no connection'})")
    if answer.status == 503:
        return Verdict("starting", f"{ready_path} 503 (loading)")
    if answer.status in (401, 403):
        return Verdict("failed", f"{ready_path} {answer.status}: the process wants an API key")
    return Verdict("starting", f"{ready_path} {answer.status}")


def evaluate(
    answer: HttpAnswer | None,
    service: ServiceInfo | None,
    *,
    ready_path: str,
    since: float,
) -> Verdict:
    """Combine the service manager's view and the HTTP answer (None: this process serves no
    HTTP, e.g. node rank 1 of a multi-node instance, which `follow_rank0` settles)."""
    failed = evaluate_service(service, since)
    if failed is not None:
        return failed
    if answer is None:
        return Verdict("starting", "serves no HTTP; follows its rank 0")
    verdict = evaluate_http(answer, ready_path)
    if verdict.state == "waiting" and service is not None and service.state in RUNNING_STATES:
        return Verdict("starting", f"process up (pid {service.pid}), {verdict.detail}")
    return verdict


def follow_rank0(own: Verdict, rank0: Verdict) -> Verdict:
    """A non-HTTP node's verdict: its own failure, else rank 0's state."""
    if own.state == "failed":
        return own
    return Verdict(rank0.state, f"rank 0 is {rank0.state}")


def timed_out(verdict: Verdict, elapsed: float, timeout: float) -> Verdict:
    """`verdict`, or a timeout verdict when time is up and it is not settled."""
    if verdict.done or elapsed < timeout:
        return verdict
    return Verdict("timeout", f"not ready after {timeout:.0f} s: {verdict.detail}")
