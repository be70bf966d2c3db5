"""pdkit's router command line as the Plan gives it: `python -m kit.lb WORKERS SETTINGS`.

`worker_args` lists the workers in the form smg takes too (`--prefill URL BOOTSTRAP_PORT`,
`--decode URL`), so that both routers are rendered from the same list; `settings_args` are
the router's own options (the topology's `router:`), which `kit.lb.config` parses. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kit.lb.config import LbConfig, stall_timeout_for
from kit.net import bare_host
from kit.topology.args import normalize_flag, render_args
from kit.topology.plan_types import WorkerProcess
from kit.topology.schema import Topology
from kit.topology.timeouts import handoff_limit_s

LB_MODULE = "kit.lb"
SMG_REQUEST_TIMEOUT = 1800
"""smg 1.13's --request-timeout-secs default (s)."""


def worker_args(workers: Iterable[WorkerProcess]) -> list[str]:
    """The worker flags of the processes that serve HTTP (node rank 0 of each instance), in
    Plan order."""
    args: list[str] = []
    for w in workers:
        if not w.serves_http:
            continue
        if w.role == "prefill":
            args += ["--prefill", w.url, str(w.bootstrap_port)]
        else:
            args += ["--decode", w.url]
    return args


def common_args(topology: Topology, policies: dict[str, str]) -> list[str]:
    """The options both routers share: where they listen and their policies (`policies`:
    role -> policy, defaults applied)."""
    router = topology.router
    args = ["--host", bare_host(router.bind), "--port", str(router.port)]
    return [*args, "--prefill-policy", policies["prefill"], "--decode-policy", policies["decode"]]


def extra_args(topology: Topology) -> list[str]:
    """The topology's `router.args`, rendered like every `args:`."""
    return render_args({normalize_flag(k): v for k, v in topology.router.args.items()})


def admission_args(topology: Topology) -> list[str]:
    """pdkit router flags for `router.admission` (none when it is off); the SLO targets default
    to the topology's `slo`."""
    admission = topology.router.admission
    if not admission.enabled:
        return []
    ttft = admission.ttft_ms or topology.slo.ttft_ms
    tpot = admission.tpot_ms or topology.slo.tpot_ms
    return [
        "--admission",
        "--slo-ttft-ms",
        f"{ttft:g}",
        "--slo-tpot-ms",
        f"{tpot:g}",
        "--admission-margin",
        f"{admission.margin:g}",
    ]


def fault_args(topology: Topology) -> list[str]:
    """pdkit router flags for `router.faults`: only those that differ from the router's own
    defaults (which are the schema's), so a topology that leaves them alone renders none.
    The stall timeout follows the topology's TPOT objective unless set; the prefill and
    request timeouts are at least the PD handoff's limit (`handoff_limit_s`)."""
    faults = topology.router.faults
    d = LbConfig(prefill=(), decode=())
    stall = (faults.stall_timeout_ms or 0) / 1000 or stall_timeout_for(topology.slo.tpot_ms / 1000)
    default_stall = stall_timeout_for(d.slo_tpot)
    admission = topology.router.admission
    if admission.enabled:  # the router derives it from the --slo-tpot-ms it is given
        default_stall = stall_timeout_for((admission.tpot_ms or topology.slo.tpot_ms) / 1000)
    # The router waits for a prefill leg and a whole request at least as long as the workers
    # may hold it in the PD handoff, so that their error, naming the timeout, comes first.
    handoff = handoff_limit_s(topology)
    values: list[tuple[str, float | int, float | int]] = [
        ("--prefill-timeout", max(d.prefill_timeout, handoff), d.prefill_timeout),
        ("--request-timeout", max(d.request_timeout, handoff), d.request_timeout),
        ("--retries", faults.retries, d.retries),
        ("--retry-deadline", faults.retry_deadline_s, d.retry_deadline),
        ("--eject-after-failures", faults.eject_after_failures, d.eject_after_failures),
        ("--hold-timeout", faults.hold_timeout_s, d.hold_timeout),
        ("--first-token-timeout", faults.first_token_timeout_s, d.first_token_timeout),
        ("--stall-timeout", stall, default_stall),
    ]
    args: list[str] = []
    for flag, value, default in values:
        if value != default:
            args += [flag, f"{value:g}"]
    if faults.eject_backoff_s != d.eject_backoff:
        args += ["--eject-backoff", f"{faults.eject_backoff_s:g}"]
        if faults.eject_backoff_s > d.eject_backoff_max:
            args += ["--eject-backoff-max", f"{faults.eject_backoff_s:g}"]
    if not faults.migrate:
        args.append("--no-migrate")
    return args


def smg_fault_args(topology: Topology) -> list[str]:
    """smg 1.13's flags for `router.faults`, and its request timeout where the PD handoff may
    take longer than its default: `--retry-max-retries` counts every attempt
    (its `--disable-retries` is 1), so it is our retries + 1; the circuit breaker opens after
    our failures in a row and stays open for our first ejection time."""
    faults = topology.router.faults
    if faults.retries == 0:
        retry = ["--disable-retries"]
    else:
        retry = [
            "--retry-max-retries",
            str(faults.retries + 1),
            "--retry-initial-backoff-ms",
            f"{faults.retry_backoff_ms:g}",
        ]
    handoff = handoff_limit_s(topology)
    timeout = (
        ["--request-timeout-secs", str(math.ceil(handoff))] if handoff > SMG_REQUEST_TIMEOUT else []
    )
    return [
        *timeout,
        *retry,
        "--cb-failure-threshold",
        str(faults.eject_after_failures),
        "--cb-timeout-duration-secs",
        str(max(1, math.ceil(faults.eject_backoff_s))),
    ]


def settings_args(topology: Topology, policies: dict[str, str]) -> list[str]:
    """pdkit's router options: listen address, policies, admission, faults, then
    `router.args`."""
    return (
        common_args(topology, policies)
        + admission_args(topology)
        + fault_args(topology)
        + extra_args(topology)
    )
